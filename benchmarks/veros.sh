#!/usr/bin/env bash
# The Veros OSSE as a benchmark (issue 26): `ensio example veros` at full size, then tables.
#
# The unmodified `acc` setup of Veros 1.7 (pip install -e '.[veros]'): spin-up, truth,
# N_e members cycled by `ensio cycle` (each member a `veros run` job on the local back-end,
# LETKF with horizontal and vertical localization) beside a free ensemble. Prints the
# RMSE of analysis and free run against the truth, spread/RMSE, and per cycle the timing
# split: member runs, queue wait, ensemble I/O, analysis (goal: I/O + analysis <= 5 %).
# About 16 minutes on 2 cores (spin-up, cycles and the free run). Results: $OUT/veros.json and the experiment in $WORKDIR
# (plots in $WORKDIR/plots). Rerunning continues an interrupted run.
#
# Environment (defaults in brackets):
#   MEMBERS CYCLES DAYS   ensemble size, cycles, model days per cycle [16 20 5]
#   JOBS                  member runs at a time [2]
#   WORKDIR               the experiment directory [${TMPDIR:-/tmp}/ensio-bench-veros]
#   OUT                   directory for the JSON result [benchmarks/results]
set -euo pipefail

source "$(dirname "$0")/common.sh"

MEMBERS=${MEMBERS:-16} CYCLES=${CYCLES:-20} DAYS=${DAYS:-5} JOBS=${JOBS:-2}
WORKDIR=${WORKDIR:-${TMPDIR:-/tmp}/ensio-bench-veros}
OUT=${OUT:-$repo/benchmarks/results}
mkdir -p "$OUT"

# Bytecode: every member run and every analysis is a fresh interpreter. Under
# PYTHONDONTWRITEBYTECODE (CI, shared checkouts) an editable install has no bytecode of
# ensio, and each analysis task compiled its ~330 modules again (~0.3 s CPU of a ~1.5 s
# task), which an installed ensio never does. A cache under WORKDIR keeps the run's
# bytecode without writing into the source tree (its first use compiles; Python checks
# every cached file against its source).
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-$WORKDIR/.pycache}

"$ensio" example veros "$WORKDIR" --members "$MEMBERS" --cycles "$CYCLES" --days "$DAYS" \
  --jobs "$JOBS" --json "$OUT/veros.json"
"$python" -m ensio.bench.veros "$OUT/veros.json"
