# Sourced by every benchmarks/*.sh: where the repository is and which programs to run.
#
# Sets: here (benchmarks/), repo (its parent), and ensio, mpiexec, python — the
# programs of the repository's venv (`make venv`) when it exists, else those on PATH.
# shellcheck shell=bash
here=$(cd "$(dirname "${BASH_SOURCE[1]:-$0}")" && pwd)
repo=$(dirname "$here")
bin="$repo/.venv/bin"
if [[ -x "$bin/ensio" ]]; then
  ensio="$bin/ensio"; mpiexec="$bin/mpiexec"; python="$bin/python"
else
  ensio=ensio; mpiexec=mpiexec; python=python3
fi
