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
# The synthetic members differ by one phase shift, so their anomalies span
# only 2 dimensions everywhere and the batched kernel works in a 2-dimensional
# basis. FULLRANK=1 adds the same benchmark on a full-rank ensemble (the
# member-dependent noise variable `aux` as the state; same observations and
# locations), where the basis has k-1 = 39 dimensions.
#
# Environment (defaults in brackets):
#   NX NY MEMBERS  grid and ensemble size [360 180 40]
#   RADIUS_KM      Gaspari-Cohn support radius [5000]
#   FILTER         letkf | lestkf | lenkf [letkf]
#   NPS            MPI rank counts N_mpi [1 2]
#   REPEAT         repeats per kernel; the best time is reported [1]
#   FULLRANK=1     also run the full-rank case [off]
#   DATA           directory for the case [${TMPDIR:-/tmp}/ensio-bench-analysis]
#   OUT            directory for the JSON results [benchmarks/results]
#   KEEP=1         keep the case afterwards [removed]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
bin="$repo/.venv/bin"
if [[ -x "$bin/ensio" ]]; then
  ensio="$bin/ensio"; mpiexec="$bin/mpiexec"; python="$bin/python"
else
  ensio=ensio; mpiexec=mpiexec; python=python3
fi

NX=${NX:-360} NY=${NY:-180} MEMBERS=${MEMBERS:-40}
RADIUS_KM=${RADIUS_KM:-5000} FILTER=${FILTER:-letkf}
NPS=${NPS:-"1 2"} REPEAT=${REPEAT:-1}
DATA=${DATA:-${TMPDIR:-/tmp}/ensio-bench-analysis}
OUT=${OUT:-$repo/benchmarks/results}
mkdir -p "$OUT"

"$ensio" synth "$DATA" --nx "$NX" --ny "$NY" --members "$MEMBERS" --seed 1
# the config synth writes has obs.nc and an LETKF; the filter and radius are set here
set_analysis=(--set "analysis.filter=$FILTER"
              --set "analysis.localization={taper: gaspari-cohn, radius_km: $RADIUS_KM}")

results=()
for np in $NPS; do
  "$mpiexec" -n "$np" "$ensio" bench analysis "$DATA/ensio.yaml" --repeat "$REPEAT" \
    "${set_analysis[@]}" --json "$OUT/analysis-n$np.json"
  results+=("$OUT/analysis-n$np.json")
  if [[ "${FULLRANK:-0}" == 1 ]]; then
    "$mpiexec" -n "$np" "$ensio" bench analysis "$DATA/ensio.yaml" --repeat "$REPEAT" \
      "${set_analysis[@]}" --set "ensemble.variables=[aux]" \
      --json "$OUT/analysis-fullrank-n$np.json"
    results+=("$OUT/analysis-fullrank-n$np.json")
  fi
done

"$python" - "${results[@]}" <<'PY'
import json, sys
from ensio.bench.analysis import PHASES
from ensio.bench.machine import machine_markdown

runs = [json.load(open(p)) for p in sys.argv[1:]]
first = runs[0]
print("\n### Machine\n")
print(machine_markdown({**first["machine"], "timestamp": first["timestamp"]}))
print(f"\n{first['filter']}, {first['points']} points, {first['observations']} observations, "
      f"{first['members']} members, support radius "
      f"{first['localization']['radius_km']:g} km, best of {first['repeat']}\n")
print("| case | N_mpi | batched s | pointwise s | speedup | basis (mean size) "
      "| GEMM GFLOP/s batched / pointwise | max rel. diff |")
print("|---|---|---|---|---|---|---|---|")
for r in runs:
    case = "full rank (aux)" if r["variables"] == ["aux"] else "synthetic"
    basis = (f"{r['reduced_tiles']}/{r['tiles']} ({r['mean_basis_rank']:.1f})"
             if r.get("mean_basis_rank") is not None else f"0/{r['tiles']}")
    gf = " / ".join("–" if g is None else f"{g:.2f}" for g in (r["gflops"], r["pointwise_gflops"]))
    print(f"| {case} | {r['n_mpi']} | {r['seconds']:.2f} | {r['pointwise_seconds']:.2f} "
          f"| **{r['speedup']:.2f}×** | {basis} | {gf} | {r['max_rel_diff']:.1e} |")
for r in runs:
    case = "full rank (aux)" if r["variables"] == ["aux"] else "synthetic"
    print(f"\nSeconds per phase, {case}, N_mpi = {r['n_mpi']} (slowest rank):\n")
    shown = [p for p in PHASES if r["phases"].get(p) or r["pointwise_phases"].get(p)]
    print("| kernel | " + " | ".join(shown) + " | total |")
    print("|---" * (len(shown) + 2) + "|")
    for name, key, total in (("batched", "phases", "seconds"),
                             ("pointwise", "pointwise_phases", "pointwise_seconds")):
        print(f"| {name} | " + " | ".join(f"{r[key].get(p, 0.0):.2f}" for p in shown)
              + f" | {r[total]:.2f} |")
PY

[[ "${KEEP:-0}" == 1 ]] || rm -rf "$DATA"
