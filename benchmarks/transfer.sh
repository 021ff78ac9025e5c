#!/usr/bin/env bash
# Direct transfer between separately launched programs (issue 12): `ensio bench transfer`.
#
# A producer process writes $FILES netCDF-4 files of $SIZE_MB MiB through the
# netCDF library and a consumer process reads every variable of them through
# the netCDF library, through plain files (page cache; fsync'd), told by a pipe
# or polling, and through the transfer layer (`ensio run --transfer`) on one
# host; async and two network namespaces when the transfer layer supports them
# ("not measured" otherwise). Cases interleaved, best of $REPEAT; memcpy of the
# same bytes measured in the same run. Results: $OUT/transfer.json, the chart
# $PLOT, and a Markdown snippet (machine + table + ratios) on stdout for
# docs/benchmarks.md. Every run's specs, logs and results stay in $WORKDIR (the
# data files are removed after each run).
#
# Environment (defaults in brackets):
#   FILES      files per run [8]
#   SIZE_MB    MiB of data per file [64]
#   REPEAT     runs per case; the best is reported [5]
#   EXTRA      more arguments (e.g. "--cases pagecache,fsync,direct --poll-ms 10",
#              "--launches 21"); ENSIO_TRANSFER_HUGE_PAGES=off measures with memfds
#   WORKDIR    run directories [${TMPDIR:-/tmp}/ensio-bench-transfer]
#   OUT        directory for the JSON result [benchmarks/results]
#   PLOT       bar chart [docs/img/transfer.png]
set -euo pipefail

source "$(dirname "$0")/common.sh"

FILES=${FILES:-8} SIZE_MB=${SIZE_MB:-64} REPEAT=${REPEAT:-5}
WORKDIR=${WORKDIR:-${TMPDIR:-/tmp}/ensio-bench-transfer}
OUT=${OUT:-$repo/benchmarks/results}
PLOT=${PLOT:-$repo/docs/img/transfer.png}
mkdir -p "$OUT" "$(dirname "$PLOT")"
rm -rf "$WORKDIR"

# shellcheck disable=SC2086  # EXTRA is split on purpose
"$ensio" bench transfer --files "$FILES" --size-mb "$SIZE_MB" --repeat "$REPEAT" \
  --workdir "$WORKDIR" --json "$OUT/transfer.json" --plot "$PLOT" ${EXTRA:-}

"$python" - "$OUT/transfer.json" <<'PY'
import json, sys
from ensio.bench.machine import machine_markdown
from ensio.bench.transfer_report import headline, markdown_rows

r = json.load(open(sys.argv[1]))
st = r["settings"]


def fmt(x, spec):
    return "not measured" if x is None else format(x, spec)


print("\n### Machine\n")
print(machine_markdown(r["machine"]))
print(f"\n{st['files']} netCDF-4 files × {st['bytes_per_file'] / 2**20:.1f} MiB "
      f"({st['fields']} float32 variables {st['shape'][0]}×{st['shape'][1]}; "
      f"{st['bytes_total'] / 1e9:.2f} GB), producer and consumer one process each; consumer "
      f"reads {r['reading']}; best of {st['repeat']}, interleaved; {r['cores']} cores, load "
      f"average {r['load_average_start'][0]:.2f} at the start, {r['load_average'][0]:.2f} at "
      f"the end\n")
print("\n".join(markdown_rows(r)))
print(f"\nmemcpy of the same bytes {r['memcpy_gb_per_s']:.2f} GB/s; writing them into fresh "
      f"memory (memfd) {r['fresh_memory_write_gb_per_s']:.2f} GB/s")
print(f"speedup_fsync {fmt(r['speedup_fsync'], '.2f')}, speedup_pagecache "
      f"{fmt(r['speedup_pagecache'], '.2f')}, memcpy_fraction "
      f"{fmt(r['memcpy_fraction'], '.3f')}, async_after_close_ratio "
      f"{fmt(r['async_after_close_ratio'], '.3f')}; verified {r['verified']}")
print(headline(r))
PY
