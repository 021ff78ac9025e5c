#!/usr/bin/env bash
# Output cost of a computing model (issue 11): `ensio bench ioserver`.
#
# Runs the 3-D diffusion model (`ensio model stencil`) on $RANKS model ranks
# without output and with sync, attached and server (S = $SERVERS) output,
# interleaved, best of $REPEAT, each as its own mpiexec job; reports
# (t - t_no_output) / t_no_output per mode, the client wait and the server
# cost projected to dedicated server cores. Results: $OUT/ioserver.json, the
# chart $PLOT, and a Markdown snippet (machine + table + costs) on stdout for
# docs/benchmarks.md. Every run's iodef, log and output files stay in $WORKDIR.
#
# Environment (defaults in brackets):
#   MODEL      python or fortran (the Fortran twin, MPMD server mode) [python]
#   RANKS      model ranks P [1]
#   SERVERS    server counts [1,2]
#   REPEAT     runs per mode; the best is reported [3]
#   EXTRA      more arguments (e.g. "--nx 512 --ny 256 --every 12")
#   WORKDIR    run directories [${TMPDIR:-/tmp}/ensio-bench-ioserver]
#   OUT        directory for the JSON result [benchmarks/results]; the file is
#              ioserver.json (ioserver-fortran.json with MODEL=fortran)
#   PLOT       bar chart [docs/img/ioserver.png, docs/img/ioserver-fortran.png]
set -euo pipefail

source "$(dirname "$0")/common.sh"

MODEL=${MODEL:-python} RANKS=${RANKS:-1} SERVERS=${SERVERS:-1,2} REPEAT=${REPEAT:-3}
WORKDIR=${WORKDIR:-${TMPDIR:-/tmp}/ensio-bench-ioserver}
suffix=""
[ "$MODEL" = python ] || suffix="-$MODEL"
OUT=${OUT:-$repo/benchmarks/results}
PLOT=${PLOT:-$repo/docs/img/ioserver$suffix.png}
JSON=$OUT/ioserver$suffix.json
mkdir -p "$OUT" "$(dirname "$PLOT")"
rm -rf "$WORKDIR"

# shellcheck disable=SC2086  # EXTRA is split on purpose
"$ensio" bench ioserver --model "$MODEL" --ranks "$RANKS" --servers "$SERVERS" \
  --repeat "$REPEAT" --workdir "$WORKDIR" --json "$JSON" --plot "$PLOT" ${EXTRA:-}

"$python" - "$JSON" <<'PY'
import json, sys
from ensio.bench.ioserver import markdown_rows
from ensio.bench.machine import machine_markdown

r = json.load(open(sys.argv[1]))
st, p = r["settings"], r["projection"]
print("\n### Machine\n")
print(machine_markdown(r["machine"]))
print(f"\n{st.get('model', 'python')} model, {st['ranks']} model rank(s) on {r['cores']} "
      f"cores; {st['fields']} 3-D fields "
      f"{st['nx']}x{st['ny']}x{st['nz']} + 1 2-D field every {st['every']} of {st['steps']} "
      f"steps ({8 * st['nx'] * st['ny'] * (st['nz'] * st['fields'] + 1) / 1e6:.1f} MB per "
      f"output), "
      f"{st['sweeps']} sweeps per step, zlib level {st['compression']}; best of "
      f"{st['repeat']}\n")
print("\n".join(markdown_rows(r)))
print(f"\nMeasured: cost_sync {100 * r['cost_sync']:.2f} %, cost_attached "
      f"{100 * r['cost_attached']:.2f} %, cost_server {100 * r['cost_server']:.2f} % "
      f"(in the loop {100 * r['cost_server_loop']:.2f} %), client_wait_fraction "
      f"{100 * r['client_wait_fraction']:.2f} %")
print(f"Projected to dedicated server cores (a model): cost_server_projected "
      f"{100 * r['cost_server_projected']:.3f} % (copy {p['c_byte_ns']:.3f} ns/B, "
      f"{p['c_msg_us']:.0f} µs/message, server {p['server_seconds_per_output']:.3f} s per "
      f"output vs model {p['model_seconds_per_output']:.3f} s); sync / projected server "
      f"{r['sync_over_server_projected']:.0f}×")
PY
