#!/usr/bin/env bash
# Dynamic job pool benchmark (issue 4): `ensio bench pool`.
#
# (a) 1000 no-op tasks on 4 local workers: per-task overhead (median, p99) and
#     tasks/s; (b) 100 tasks of 0.2 s on 4 workers: makespan / ideal (goal <= 1.05).
# The to-do lists live in $WORKDIR, so its file system (fsync, rename, locks)
# is what is measured. Results: $OUT/pool.json and a Markdown snippet (machine
# + numbers) on stdout for docs/benchmarks.md.
#
# Environment (defaults in brackets):
#   JOBS          N_j [4]
#   NOOP SLEEP    task counts of (a) and (b) [1000 100]
#   SECONDS_EACH  task length of (b) [0.2]
#   REPEAT        runs of (b); the median is reported [3]
#   LOCK          auto|flock|lockf|mkdir [auto]
#   WORKDIR       directory of the lists [${TMPDIR:-/tmp}/ensio-bench-pool]
#   OUT           directory for the JSON result [benchmarks/results]
set -euo pipefail

source "$(dirname "$0")/common.sh"

JOBS=${JOBS:-4} NOOP=${NOOP:-1000} SLEEP=${SLEEP:-100} SECONDS_EACH=${SECONDS_EACH:-0.2}
LOCK=${LOCK:-auto} REPEAT=${REPEAT:-3}
WORKDIR=${WORKDIR:-${TMPDIR:-/tmp}/ensio-bench-pool}
OUT=${OUT:-$repo/benchmarks/results}
mkdir -p "$OUT"
rm -rf "$WORKDIR"

"$ensio" bench pool --jobs "$JOBS" --noop-tasks "$NOOP" --sleep-tasks "$SLEEP" \
  --sleep-seconds "$SECONDS_EACH" --repeat "$REPEAT" --lock "$LOCK" --workdir "$WORKDIR" \
  --json "$OUT/pool.json"
rm -rf "$WORKDIR"

"$python" - "$OUT/pool.json" <<'PY'
import json, sys
from ensio.bench.machine import machine_markdown

r = json.load(open(sys.argv[1]))
print("\n### Machine\n")
print(machine_markdown(r["machine"]))
a, b = r.get("noop"), r.get("sleep")
print(f"\nN_j = {r['jobs']} local workers, lock {(a or b)['lock']}\n")
print("| case | tasks | overhead median ms | overhead p99 ms | commit median ms | tasks/s "
      "| makespan s | ideal s | makespan / ideal |")
print("|---|---|---|---|---|---|---|---|---|")
if a:
    print(f"| (a) no-op | {a['tasks']} | {a['overhead_ms']['median']:.2f} "
          f"| {a['overhead_ms']['p99']:.2f} | {a['commit_ms']['median']:.1f} "
          f"| {a['tasks_per_second']:.1f} | {a['seconds']:.2f} | | |")
if b:
    print(f"| (b) {b['task_seconds']} s | {b['tasks']} | {b['overhead_ms']['median']:.2f} "
          f"| {b['overhead_ms']['p99']:.2f} | {b['commit_ms']['median']:.1f} | "
          f"| {b['makespan']:.3f} | {b['ideal']:.3f} | **{b['ratio']:.3f}** |")
    runs = ", ".join(f"{x:.3f}" for x in b["ratios"])
    print(f"\n(b), median of {b['repeat']} runs ({runs}): mean task {b['mean_task_seconds']:.4f} s; "
          f"worker start spread {b['worker_start_spread']:.3f} s; makespan over the ideal "
          f"counted from each worker's start: {b['ratio_from_worker_start']:.3f}; over the "
          f"measured task durations: {b['ratio_measured']:.3f}.")
PY
