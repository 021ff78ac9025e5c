#!/usr/bin/env bash
# Tiled members on node-local disks (issue 13, item 2): `ensio bench shuffle`.
#
# The same synthetic case (N_e members, NX x NY x LEVELS float64, CDF-5) through
# io.mode files (N_io readers + scatter, single-file members) and io.mode shuffle
# (P = N_mpi / N_e tiles, one per rank in its own local directory, group
# Alltoallv) at N_mpi = RANKS, one mpiexec job each (oversubscribed beyond the
# cores: the JSON lists which). Reported: seconds per phase, MPI bytes, partners
# per rank; a cost model fed with the measured per-byte costs projects both
# modes to thousands of nodes. Results: $OUT/shuffle.json, the chart $PLOT and
# a Markdown snippet (machine + numbers) on stdout for docs/benchmarks.md.
#
# Environment (defaults in brackets):
#   NX NY LEVELS  grid [720 360 4]
#   MEMBERS       N_e [2]
#   RANKS         N_mpi list, multiples of MEMBERS [2,4,8]
#   REPEAT        read+write cycles per mode, the best is reported [3]
#   WORKDIR       case, tiles and local directories [${TMPDIR:-/tmp}/ensio-bench-shuffle]
#   OUT           directory for the JSON and PNG [benchmarks/results]
#   EXTRA         more options, e.g. "--proj-members 128 --proj-fs-gbs 50"
set -euo pipefail

source "$(dirname "$0")/common.sh"

NX=${NX:-720} NY=${NY:-360} LEVELS=${LEVELS:-4} MEMBERS=${MEMBERS:-2} RANKS=${RANKS:-2,4,8}
REPEAT=${REPEAT:-3}
WORKDIR=${WORKDIR:-${TMPDIR:-/tmp}/ensio-bench-shuffle}
OUT=${OUT:-$repo/benchmarks/results}
PLOT=${PLOT:-$repo/docs/img/shuffle.png}
mkdir -p "$OUT" "$(dirname "$PLOT")"
rm -rf "$WORKDIR"

# shellcheck disable=SC2086  # EXTRA is split on purpose
"$ensio" bench shuffle --nx "$NX" --ny "$NY" --levels "$LEVELS" --members "$MEMBERS" \
  --ranks "$RANKS" --repeat "$REPEAT" --workdir "$WORKDIR" \
  --json "$OUT/shuffle.json" --plot "$PLOT" ${EXTRA:-}
rm -rf "$WORKDIR"

"$python" - "$OUT/shuffle.json" <<'PY'
import json, sys
from ensio.bench.machine import machine_markdown
from ensio.bench.shuffle import markdown_rows

r = json.load(open(sys.argv[1]))
st = r["settings"]
print("\n### Machine\n")
print(machine_markdown(r["machine"]))
print(f"\nN_e = {st['members']}, {st['nx']}x{st['ny']}x{st['levels']} float64 "
      f"({r['state_bytes_per_member'] / 1e6:.1f} MB of state per member), CDF-5; "
      f"{r['cores']} cores, oversubscribed at N_mpi {r['oversubscribed'] or 'none'}; "
      f"best of {st['repeat']} identity read + write cycles\n")
print("\n".join(markdown_rows(r)))
PY
