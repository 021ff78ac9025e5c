#!/usr/bin/env bash
# Parallel ensemble I/O benchmark (issue 2, item 8): synthetic case + `ensio bench io`.
#
# Many small files (issue 13, item 6): NX=720 NY=360 MEMBERS=12 FORMAT=netcdf4|cdf5;
# the per-file cost (open + metadata, µs) is in the JSON as per_file_us.
#
# Creates the synthetic problem of Zheng et al. with `ensio synth` and runs
# `mpiexec -n $NP ensio bench io` on it twice: journal off (the acceptance
# figure) and journal on (its extra cost). Results: $OUT/io-journal-{off,on}.json
# and a Markdown snippet (machine + numbers) on stdout for docs/benchmarks.md.
#
# Environment (defaults in brackets):
#   NX NY MEMBERS  grid and ensemble size [3600 1800 40: the paper's case, 2.07 GB float64]
#   FORMAT DTYPE   netcdf4|cdf5, float64|float32 [netcdf4 float64]
#   NP             MPI ranks N_mpi [2]
#   TASKS          N_io (io.tasks) [unset: min(N_mpi, N_e)]
#   REPEAT         repeats; the best time of each measurement is reported [3]
#   DATA           directory for the member files [${TMPDIR:-/tmp}/ensio-bench-io]
#   OUT            directory for the JSON results [benchmarks/results]
#   KEEP=1         keep the member files afterwards [removed]
set -euo pipefail

source "$(dirname "$0")/common.sh"

NX=${NX:-3600} NY=${NY:-1800} MEMBERS=${MEMBERS:-40}
FORMAT=${FORMAT:-netcdf4} DTYPE=${DTYPE:-float64}
NP=${NP:-2} REPEAT=${REPEAT:-3}
DATA=${DATA:-${TMPDIR:-/tmp}/ensio-bench-io}
OUT=${OUT:-$repo/benchmarks/results}
mkdir -p "$OUT"

"$ensio" synth "$DATA" --nx "$NX" --ny "$NY" --members "$MEMBERS" --seed 1 \
  --format "$FORMAT" --dtype "$DTYPE"

extra=()
[[ -n "${TASKS:-}" ]] && extra+=(--set "io.tasks=$TASKS")
for journal in off on; do
  flag=$([[ $journal == on ]] && echo true || echo false)
  "$mpiexec" -n "$NP" "$ensio" bench io "$DATA/ensio.yaml" --repeat "$REPEAT" \
    --set "io.journal=$flag" "${extra[@]}" --json "$OUT/io-journal-$journal.json"
done

"$python" - "$OUT/io-journal-off.json" "$OUT/io-journal-on.json" <<'PY'
import json, sys
from ensio.bench.machine import machine_markdown

off, on = (json.load(open(p)) for p in sys.argv[1:])
print("\n### Machine\n")
print(machine_markdown({**off["machine"], "timestamp": off["timestamp"]}))
print(f"\n### {off['members']} members, {off['state_bytes'] / 1e9:.3g} GB of state, "
      f"N_mpi = {off['n_mpi']}, best of {off['repeat']}\n")
print("| journal | N_io | read GB/s | write GB/s | read+write GB/s | raw GB/s | naive GB/s "
      "| ratio_raw | ratio_naive |")
print("|---|---|---|---|---|---|---|---|---|")
for name, r in (("off", off), ("on", on)):
    print(f"| {name} | {r['n_io']} | {r['read']['gbps']:.2f} | {r['write']['gbps']:.2f} "
          f"| {r['throughput_gbps']:.2f} | {r['raw_gbps']:.2f} | {r['naive_gbps']:.2f} "
          f"| {r['ratio_raw']:.2f} | {r['ratio_naive']:.2f} |")
print(f"\nPer-file cost (open + metadata, one process): {off['per_file_us']:.0f} µs; "
      f"metadata pass over all {off['files']} files: {off['metadata_seconds'] * 1e3:.2f} ms; "
      f"quick-checked: {off['quick_checked']:.0%}.")
extra = on["write"]["seconds"] - off["write"]["seconds"]
one_write = off["state_bytes"] / (off["write"]["raw_gbps"] * 1e9)
print(f"\nJournal cost on write: +{extra:.3f} s "
      f"(one raw write of the state bytes takes {one_write:.3f} s).")
parts = ("reading", "writing", "communication", "waiting", "journal", "total")
print("\nBreakdown of the journal-off run (seconds, per-rank maximum):\n")
print("| | " + " | ".join(parts) + " |")
print("|---" * (len(parts) + 1) + "|")
for d in ("read", "write"):
    print(f"| {d} | " + " | ".join(f"{off[d]['breakdown'][k]:.3f}" for k in parts) + " |")
PY

[[ "${KEEP:-0}" == 1 ]] || rm -rf "$DATA"
