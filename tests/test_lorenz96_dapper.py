"""ensio's filters against DAPPER 1.7.1 on DAPPER's own Lorenz-96 experiment.

The experiment is DAPPER's ``mods/Lorenz96/sakov2008`` term for term
(:mod:`ensio.bench.lorenz96_dapper`: 1001 analyses, scored after t = 20, truth
and members drawn around ``e_0``), and inflation is DAPPER's ``infl``:
``analysis.inflation.posterior``. The reference figures are DAPPER 1.7.1
itself on this set-up (``pip install dapper==1.7.1``; ``rmse.a``, mean ±
standard error over ``dpr.set_seed(1..S)``: EnKF S = 10, ETKF S = 60, LETKF
S = 20; 2026-11-25, the commands of ``benchmarks/lorenz96_dapper.sh`` with
``DAPPER_PYTHON``). ensio must agree within two combined standard errors over
its own fixed seeds 1..n (its streams are not DAPPER's; n = 20 for the
cheap ETKF, whose reference error is the smallest).

About a minute in all on an idle core (one BLAS thread), so it runs with
``make test``; ``-m "not slow"`` leaves it out.
"""

from __future__ import annotations

import numpy as np
import pytest

from ensio.bench.lorenz96_dapper import Sakov2008, analysis_rmse, dapper_gc_support, summarize
from ensio.config.analysis import AnalysisSection, InflationSection, LocalizationSection

#: name → (filter section, N, ensio seeds, DAPPER 1.7.1 rmse.a mean, its standard error)
CASES = {
    # EnKF('PertObs', N=40, infl=1.06)
    "enkf": (AnalysisSection(filter="enkf", inflation=InflationSection(posterior=1.06)),
             40, range(1, 11), 0.2166, 0.0016),
    # EnKF('Sqrt', N=24, infl=1.02)
    "etkf": (AnalysisSection(filter="etkf", inflation=InflationSection(posterior=1.02)),
             24, range(1, 21), 0.1837, 0.0008),
    # LETKF(N=10, infl=1.04, loc_rad=4): Gaspari-Cohn support 2 * 1.82 * 4 = 14.56
    "letkf": (AnalysisSection(
        filter="letkf", inflation=InflationSection(posterior=1.04),
        localization=LocalizationSection(taper="gaspari-cohn", radius=dapper_gc_support(4),
                                         periodic=40)),
              10, range(1, 11), 0.2133, 0.0010),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_matches_dapper_within_two_standard_errors(name):
    cfg, members, seeds, ref, ref_se = CASES[name]
    got = summarize(cfg, members, seeds)
    print(f"sakov2008 {name} N={members}: ensio {got.mean:.4f} ± {got.stderr:.4f} over "
          f"{len(got.values)} seeds, DAPPER 1.7.1 {ref:.4f} ± {ref_se:.4f}")
    assert got.within(ref, ref_se, 2.0), (got.mean, got.stderr, ref, ref_se)


def test_setup_is_dappers_chronology():
    s = Sakov2008()
    scored = s.scored()
    assert scored.size == 1001  # K = dko (Ko + 1), Ko = 1000
    assert int(scored.sum()) == 601  # t > BurnIn = 20 (strictly), t = 0.05 k, k = 1..1001
    assert not scored[399] and scored[400]
    # batches of 2: both variables of a batch sit at its centre
    np.testing.assert_array_equal(s.row_coords()[:6], [0.5, 0.5, 2.5, 2.5, 4.5, 4.5])
    assert dapper_gc_support(4) == pytest.approx(14.56)
    with pytest.raises(ValueError, match="burn_in"):
        Sakov2008(cycles=400)


def test_seed_gives_the_same_experiment():
    short = Sakov2008(cycles=420)
    cfg = CASES["etkf"][0]
    assert analysis_rmse(cfg, 24, 5, short) == analysis_rmse(cfg, 24, 5, short)
    assert analysis_rmse(cfg, 24, 5, short) != analysis_rmse(cfg, 24, 6, short)
