#!/usr/bin/env bash
# Local analysis benchmark (issue 3, item 7): synthetic case + `ensio bench analysis`.
#
# Creates the synthetic problem with `ensio synth` (its config has the
# observations, obs.nc with 10 % of the grid points), sets an LETKF with a
# 5000 km Gaspari-Cohn support radius, and runs `mpiexec -n N ensio bench analysis`
# for every N in $NPS: the batched kernel and the pointwise reference in the
# same run, per phase, file I/O excluded. Results: $OUT/analysis-n$N.json and
# a Markdown snippet (machine + tables) on stdout for docs/benchmarks.md.
#
# The case is full-rank, as real ensembles are locally: `ensio synth
# --perturbation A --perturbation-scale S` adds to each member A times its own
# smooth random field (Gaussian of S grid points), so the local anomalies span
# k-1 = 39 dimensions and no reduced basis applies. The paper's members alone
# differ by one phase shift (anomalies of rank 2 everywhere, where the batched
# kernel works in a 2-dimensional basis): RANK2=1 adds that degenerate case
# (same observations and locations) for comparison.
#
# Environment (defaults in brackets):
#   NX NY          grid [360 180]
#   MEMBERS        ensemble size N_e, or a list ("20 40 100": how each phase
#                  grows with N_e, and the peak memory per rank, in one more
#                  table; results analysis-k<N_e>-n<N_mpi>.json) [40]
#   RADIUS_KM      Gaspari-Cohn support radius [5000]
#   FILTER         letkf | lestkf | lenkf [letkf]
#   NPS            MPI rank counts N_mpi [1 2]
#   REPEAT         repeats per kernel; the best time is reported [1]
#   PERTURBATION   amplitude A of the smooth member perturbation [0.1]
#   PERT_SCALE     its Gaussian smoothing, grid points [4]
#   RANK2=1        also run the paper's rank-2 (unperturbed) case [off]
#   DATA           directory for the case [${TMPDIR:-/tmp}/ensio-bench-analysis]
#   OUT            directory for the JSON results [benchmarks/results]
#   KEEP=1         keep the cases afterwards [removed]
set -euo pipefail

source "$(dirname "$0")/common.sh"

NX=${NX:-360} NY=${NY:-180} MEMBERS=${MEMBERS:-40}
RADIUS_KM=${RADIUS_KM:-5000} FILTER=${FILTER:-letkf}
NPS=${NPS:-"1 2"} REPEAT=${REPEAT:-1}
PERTURBATION=${PERTURBATION:-0.1} PERT_SCALE=${PERT_SCALE:-4}
DATA=${DATA:-${TMPDIR:-/tmp}/ensio-bench-analysis}
OUT=${OUT:-$repo/benchmarks/results}
mkdir -p "$OUT"

# the config synth writes has obs.nc and an LETKF; the filter and radius are set here
set_analysis=(--set "analysis.filter=$FILTER"
              --set "analysis.localization={taper: gaspari-cohn, radius_km: $RADIUS_KM}")
read -r -a sizes <<< "$MEMBERS"

results=()
for k in "${sizes[@]}"; do
  # one size keeps the historical result names; a list of sizes adds -k<N_e>
  tag=""; [[ ${#sizes[@]} -gt 1 ]] && tag="-k$k"
  "$ensio" synth "$DATA/fullrank$tag" --nx "$NX" --ny "$NY" --members "$k" --seed 1 \
    --perturbation "$PERTURBATION" --perturbation-scale "$PERT_SCALE"
  if [[ "${RANK2:-0}" == 1 ]]; then
    # the same seed: the same observations, members without the perturbation
    "$ensio" synth "$DATA/rank2$tag" --nx "$NX" --ny "$NY" --members "$k" --seed 1
  fi
  for np in $NPS; do
    "$mpiexec" -n "$np" "$ensio" bench analysis "$DATA/fullrank$tag/ensio.yaml" \
      --repeat "$REPEAT" "${set_analysis[@]}" --json "$OUT/analysis$tag-n$np.json"
    results+=("$OUT/analysis$tag-n$np.json")
    if [[ "${RANK2:-0}" == 1 ]]; then
      "$mpiexec" -n "$np" "$ensio" bench analysis "$DATA/rank2$tag/ensio.yaml" \
        --repeat "$REPEAT" "${set_analysis[@]}" --json "$OUT/analysis-rank2$tag-n$np.json"
      results+=("$OUT/analysis-rank2$tag-n$np.json")
    fi
  done
  # one size on disk at a time
  [[ "${KEEP:-0}" == 1 ]] || rm -rf "$DATA/fullrank$tag" "$DATA/rank2$tag"
done

"$python" - "$PERTURBATION" "$PERT_SCALE" "${results[@]}" <<'PY'
import json, sys, os
from ensio.bench.analysis import PHASES
from ensio.bench.machine import machine_markdown

amp, scale = sys.argv[1:3]
paths = sys.argv[3:]
runs = [json.load(open(p)) for p in paths]
cases = ["rank 2 (unperturbed)" if "-rank2-" in os.path.basename(p)
         else f"full rank (A = {amp}, S = {scale})" for p in paths]
first = runs[0]
print("\n### Machine\n")
print(machine_markdown({**first["machine"], "timestamp": first["timestamp"]}))
print(f"\n{first['filter']}, {first['points']} points, {first['observations']} observations, "
      f"support radius {first['localization']['radius_km']:g} km, best of {first['repeat']}\n")
print("| case | N_e | N_mpi | batched s | pointwise s | speedup | basis (mean size) "
      "| GEMM GFLOP/s batched / pointwise | max rel. diff |")
print("|---|---|---|---|---|---|---|---|---|")
for case, r in zip(cases, runs):
    basis = (f"{r['reduced_tiles']}/{r['tiles']} ({r['mean_basis_rank']:.1f})"
             if r.get("mean_basis_rank") is not None else f"0/{r['tiles']}")
    gf = " / ".join("–" if g is None else f"{g:.2f}" for g in (r["gflops"], r["pointwise_gflops"]))
    print(f"| {case} | {r['members']} | {r['n_mpi']} | {r['seconds']:.2f} | {r['pointwise_seconds']:.2f} "
          f"| **{r['speedup']:.2f}×** | {basis} | {gf} | {r['max_rel_diff']:.1e} |")
# how each phase grows with N_e (MEMBERS="20 40 100"): growth against the smallest
# N_e of the same N_mpi and case, beside the expected N_e³ (transform) and N_e² (GEMM)
full = [(c, r) for c, r in zip(cases, runs) if not c.startswith("rank 2")]
if len({r["members"] for _, r in full}) > 1:
    print("\nGrowth with N_e (batched kernel, full rank; peak memory per rank: tracemalloc "
          "of one untimed run, budget = block + observations + largest tile's work arrays):\n")
    print("| N_e | N_mpi | transform s | × (N_e³ ×) | gemm s | × (N_e² ×) | total s "
          "| pointwise s | peak MiB | budget MiB | peak / budget | pointwise peak MiB |")
    print("|---" * 12 + "|")
    base = {}
    for _, r in sorted(full, key=lambda cr: (cr[1]["n_mpi"], cr[1]["members"])):
        b = base.setdefault(r["n_mpi"], r)
        f = r["members"] / b["members"]
        tr, gm = r["phases"]["transform"], r["phases"]["gemm"]
        g_tr = tr / b["phases"]["transform"] if b["phases"]["transform"] else float("nan")
        g_gm = gm / b["phases"]["gemm"] if b["phases"]["gemm"] else float("nan")
        mib = 2.0**20
        pw = r.get("pointwise_memory", {}).get("peak_bytes_per_rank", float("nan")) / mib
        print(f"| {r['members']} | {r['n_mpi']} | {tr:.2f} | {g_tr:.1f} ({f**3:.1f}) | {gm:.2f} "
              f"| {g_gm:.1f} ({f**2:.1f}) | {r['seconds']:.2f} | {r['pointwise_seconds']:.2f} "
              f"| {r['peak_bytes_per_rank'] / mib:.1f} | {r['budget_bytes'] / mib:.1f} "
              f"| {r['peak_to_budget']:.2f} | {pw:.1f} |")
for case, r in zip(cases, runs):
    print(f"\nSeconds per phase, {case}, N_e = {r['members']}, N_mpi = {r['n_mpi']} "
          "(slowest rank):\n")
    shown = [p for p in PHASES if r["phases"].get(p) or r["pointwise_phases"].get(p)]
    print("| kernel | " + " | ".join(shown) + " | total |")
    print("|---" * (len(shown) + 2) + "|")
    for name, key, total in (("batched", "phases", "seconds"),
                             ("pointwise", "pointwise_phases", "pointwise_seconds")):
        print(f"| {name} | " + " | ".join(f"{r[key].get(p, 0.0):.2f}" for p in shown)
              + f" | {r[total]:.2f} |")
PY
