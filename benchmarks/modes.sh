#!/usr/bin/env bash
# Offline vs online mode (issue 5): `ensio bench modes`.
#
# Runs the same K-cycle experiment offline (job pool) and online (one coupled
# MPI job), one `ensio cycle --cycles c` submission per cycle and mode, no start
# delay; takes total, queuing, running and I/O per cycle from the records;
# replays every cycle under the batch-queue model of ensio.bench.queueing at
# low and high machine load; with SLURM (sinfo answers), runs both modes
# through sbatch as well. Results: $OUT/modes.json, the chart $PLOT, and a
# Markdown snippet (machine + table + ratios) on stdout for docs/benchmarks.md.
#
# Environment (defaults in brackets):
#   CONFIG     the experiment [examples/lorenz96/cycle.yaml]
#   CYCLES     K, cycles per mode [4]
#   DRAWS      replays of every cycle per load [200]
#   SEED       seed of the queue waits [1]
#   SLURM      auto|yes|no [auto]
#   WORKDIR    parent of the run directories [${TMPDIR:-/tmp}/ensio-bench-modes]
#   OUT        directory for the JSON result [benchmarks/results]
#   PLOT       bar chart [docs/img/modes.png]
#   EXTRA      more arguments for ensio bench modes (e.g. "--set workflow.jobs=2")
set -euo pipefail

source "$(dirname "$0")/common.sh"

CONFIG=${CONFIG:-$repo/examples/lorenz96/cycle.yaml}
CYCLES=${CYCLES:-4} DRAWS=${DRAWS:-200} SEED=${SEED:-1} SLURM=${SLURM:-auto}
WORKDIR=${WORKDIR:-${TMPDIR:-/tmp}/ensio-bench-modes}
OUT=${OUT:-$repo/benchmarks/results}
PLOT=${PLOT:-$repo/docs/img/modes.png}
mkdir -p "$OUT" "$(dirname "$PLOT")"
rm -rf "$WORKDIR"

# shellcheck disable=SC2086  # EXTRA is split on purpose
"$ensio" bench modes "$CONFIG" --cycles "$CYCLES" --draws "$DRAWS" --seed "$SEED" \
  --slurm "$SLURM" --workdir "$WORKDIR" --json "$OUT/modes.json" --plot "$PLOT" ${EXTRA:-}
rm -rf "$WORKDIR"

"$python" - "$OUT/modes.json" <<'PY'
import json, sys
from ensio.bench.machine import machine_markdown
from ensio.bench.modes_output import markdown_table

r = json.load(open(sys.argv[1]))
print("\n### Machine\n")
print(machine_markdown(r["machine"]))
m = r["model"]
print(f"\n{r['cycles']} cycles per mode, N_e = {r['members']}, N_j = {r['jobs']}, "
      f"analysis ranks {r['analysis_ranks']}; model unit {m['params']['unit']:.2f} s, "
      f"base {m['params']['base']:g}, per_node {m['params']['per_node']:g}, "
      f"alpha {m['params']['alpha']:g}, shape {m['params']['shape']:g}, "
      f"{m['draws']} draws per cycle, seed {m['seed']}\n")
print(markdown_table(r))
sl = r["measured"]["slurm"]
if "skipped" in sl:
    print(f"\nSLURM: skipped ({sl['skipped']})")
print("\nOffline / online time to solution: "
      + ", ".join([f"measured local {r['measured']['local']['ratio']:.2f}"]
                  + ([f"SLURM {sl['ratio']:.2f}"] if "ratio" in sl else [])
                  + [f"{k} load {v['ratio']:.2f}" for k, v in m["loads"].items()]))
chk = ", ".join(f"{c['replay_total']:.2f}/{c['measured_total']:.2f}" for c in r["replay_check"])
print(f"\nZero-wait replay / measured offline total per cycle (s): {chk}")
PY
