#!/usr/bin/env bash
# ensio's filters against DAPPER on DAPPER's Lorenz-96 "sakov2008" experiment
# (issue 14, item 6): time-mean analysis RMSE (DAPPER's rmse.a) over seeds,
# mean ± standard error, for EnKF N40 infl 1.06, ETKF N24 infl 1.02 and
# LETKF N10 infl 1.04 loc_rad 4 (ensio: analysis.inflation.posterior, the
# Gaspari-Cohn support 2 * 1.82 * 4). The experiment: ensio.bench.lorenz96_dapper.
#
# With DAPPER_PYTHON set to a Python that has DAPPER installed (e.g. a venv
# with `pip install dapper==1.7.1`), DAPPER itself runs the same three
# experiments over the same number of seeds (its own random streams), and a
# last table compares: |ensio − DAPPER| / combined standard error.
#
# Environment (defaults in brackets):
#   SEEDS          number of seeds, 1..SEEDS [20]
#   CASES          which of enkf etkf letkf ["enkf etkf letkf"]
#   DAPPER_PYTHON  Python with DAPPER for the reference run [unset: ensio only]
set -euo pipefail

source "$(dirname "$0")/common.sh"
SEEDS=${SEEDS:-20} CASES=${CASES:-"enkf etkf letkf"}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for c in $CASES; do
  "$python" - "$c" "$SEEDS" > "$out/ensio-$c" <<'PY'
import sys
from ensio.config.analysis import AnalysisSection, InflationSection, LocalizationSection
from ensio.bench.lorenz96_dapper import dapper_gc_support, summarize

name, seeds = sys.argv[1], int(sys.argv[2])
loc = LocalizationSection(taper="gaspari-cohn", radius=dapper_gc_support(4), periodic=40)
cfg, n = {
    "enkf": (AnalysisSection(filter="enkf", inflation=InflationSection(posterior=1.06)), 40),
    "etkf": (AnalysisSection(filter="etkf", inflation=InflationSection(posterior=1.02)), 24),
    "letkf": (AnalysisSection(filter="letkf", localization=loc,
                              inflation=InflationSection(posterior=1.04)), 10),
}[name]
s = summarize(cfg, n, range(1, seeds + 1))
print(f"RESULT {s.mean:.4f} {s.stderr:.4f}")
PY
  if [[ -n "${DAPPER_PYTHON:-}" ]]; then
    OPENBLAS_NUM_THREADS=1 "$DAPPER_PYTHON" - "$c" "$SEEDS" > "$out/dapper-$c" 2>/dev/null <<'PY'
import sys
import numpy as np
import dapper as dpr
import dapper.da_methods as da
from dapper.mods.Lorenz96.sakov2008 import HMM

name, seeds = sys.argv[1], int(sys.argv[2])
make = {"enkf": lambda: da.EnKF("PertObs", N=40, infl=1.06),
        "etkf": lambda: da.EnKF("Sqrt", N=24, infl=1.02),
        "letkf": lambda: da.LETKF(N=10, infl=1.04, loc_rad=4)}[name]
scores = []
for seed in range(1, seeds + 1):
    xp = make()
    dpr.set_seed(seed)
    xx, yy = HMM.simulate()
    xp.assimilate(HMM, xx, yy, liveplots=False)
    xp.stats.average_in_time()
    scores.append(xp.avrgs.rmse.a.val)
v = np.array(scores)
print(f"RESULT {v.mean():.4f} {v.std(ddof=1) / np.sqrt(v.size):.4f}")
PY
  fi
done

echo
echo "sakov2008 (Lorenz-96, 40 variables, 1001 analyses, scored after t = 20), seeds 1..$SEEDS"
echo
if [[ -n "${DAPPER_PYTHON:-}" ]]; then
  echo "| case | ensio rmse.a | DAPPER rmse.a | difference / combined s.e. |"
  echo "|---|---|---|---|"
else
  echo "| case | ensio rmse.a |"
  echo "|---|---|"
fi
for c in $CASES; do
  # DAPPER prints notices on standard output too: the figures are on the RESULT line
  read -r _ m s < <(grep '^RESULT' "$out/ensio-$c")
  if [[ -n "${DAPPER_PYTHON:-}" ]]; then
    read -r _ dm ds < <(grep '^RESULT' "$out/dapper-$c")
    z=$("$python" -c "import math; print(f'{abs($m - $dm) / math.hypot($s, $ds):.2f}')")
    echo "| $c | $m ± $s | $dm ± $ds | $z |"
  else
    echo "| $c | $m ± $s |"
  fi
done
