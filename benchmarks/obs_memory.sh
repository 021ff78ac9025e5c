#!/usr/bin/env bash
# Peak observation memory per rank (issue 13, item 5): replicated vs regional distribution.
#
# Writes a synthetic ensemble (NX x NY, 2 members) and NOBS observations uniform
# on the sphere (bilinear H), then under `mpiexec -n N` loads the observations
# three ways (replicated: rank 0 reads and broadcasts; replicated-partial: every
# rank reads all locations; regional: every rank reads a slice and receives the
# observations near its rows) and prints, per mode and rank, the peak of
# Python-traced memory (numpy included) while loading, and the observations held.
#
# Environment (defaults in brackets):
#   NOBS        observations [1000000]
#   NX NY       grid [720 360]
#   RADIUS_KM   support radius [1000]
#   NPS         rank counts [2 4]
#   DATA        directory for the case [${TMPDIR:-/tmp}/ensio-bench-obsmem]
#   OUT         directory for the JSON results [benchmarks/results]
set -euo pipefail

source "$(dirname "$0")/common.sh"
NOBS=${NOBS:-1000000}
NX=${NX:-720}
NY=${NY:-360}
RADIUS_KM=${RADIUS_KM:-1000}
NPS=${NPS:-2 4}
DATA=${DATA:-${TMPDIR:-/tmp}/ensio-bench-obsmem}
OUT=${OUT:-$repo/benchmarks/results}
PY=${PYTHON:-$python}
MPIEXEC=${MPIEXEC:-$mpiexec}
mkdir -p "$OUT"
for n in $NPS; do
  json="$OUT/obsmem-n$n.json"
  "$MPIEXEC" -n "$n" "$PY" -c "
import json, sys
from mpi4py import MPI
from ensio.bench.obsmem import measure
r = measure('$DATA/n$n', $NOBS, $NX, $NY, $RADIUS_KM, MPI.COMM_WORLD)
if MPI.COMM_WORLD.rank == 0:
    json.dump(r, open('$json', 'w'), indent=1)
    print(f\"N_mpi = {r['ranks']}, {r['n_obs']} observations, grid {r['grid']}, radius {r['radius_km']} km\")
    print('| mode | peak MB per rank | observations held per rank | seconds |')
    print('|---|---|---|---|')
    for m, v in r['modes'].items():
        print(f\"| {m} | {v['peak_mb']} | {v['held']} | {max(v['seconds'])} |\")
"
done
rm -rf "$DATA"
