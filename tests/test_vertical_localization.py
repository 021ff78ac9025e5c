"""Vertical localization (issue 26, item 2): 3-D states, profiles and surface observations.

The offline analysis on member files (``ensio.offline.run_analysis``) must
equal the independent point-by-point LETKF of ``tests/vertical_case.py``
(≤ 1e-10) for every vertical taper, both kernels, threads, a regulated-free
configuration with inflation; the unit tests check the taper's conventions
and that a row or an observation without a level gets vertical weight 1.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI
from seeds import draw_seed
from vertical_case import (
    DEPTH,
    LAT,
    LON,
    kalman_gain_rows,
    letkf_rows,
    make_case,
    reference_letkf,
    rel,
    stacked,
    vertical_taper,
    weights,
    write_obs,
)

from ensio.analysis import analyse
from ensio.analysis.localization import TAPERS, Geometry, Localization, VerticalLocalization
from ensio.config import config_from_dict
from ensio.config.analysis import AnalysisSection, LocalizationSection, VerticalLocalizationSection
from ensio.errors import ConfigError
from ensio.obs import ObsBatch
from ensio.offline import run_analysis

TAPER_NAMES = sorted(TAPERS)


@pytest.fixture()
def case(tmp_path):
    return make_case(tmp_path / "ens", np.random.default_rng(draw_seed("vertical case")))


def analysed(case, vertical, **analysis) -> np.ndarray:
    cfg = config_from_dict(case.config(vertical, **analysis))
    run_analysis(cfg, MPI.COMM_SELF)
    return case.read_state()


@pytest.mark.parametrize("taper", TAPER_NAMES)
def test_equals_the_pointwise_reference_for_every_taper(case, taper):
    vertical = {"radius": 250.0, "taper": taper}
    want = reference_letkf(case, vertical)
    got = analysed(case, vertical)
    assert rel(got, want) <= 1e-10, rel(got, want)
    # and the vertical taper matters: horizontal-only is a different analysis
    assert rel(reference_letkf(case, None), want) > 1e-3


@pytest.mark.parametrize(
    "analysis",
    [
        {"kernel": "pointwise"},
        {"threads": 2, "tile_points": 16},
        {"inflation": {"forget": 0.8}},
    ],
    ids=["pointwise", "threads", "forget"],
)
def test_other_paths_equal_the_reference(case, analysis):
    vertical = {"radius": 120.0}
    forget = analysis.get("inflation", {}).get("forget", 1.0)
    want = reference_letkf(case, vertical, forget=forget)
    got = analysed(case, vertical, **analysis)
    assert rel(got, want) <= 1e-10, rel(got, want)


@pytest.mark.parametrize("taper", ["gaussian", "step"])
def test_other_horizontal_tapers_with_the_vertical_one(case, taper):
    """Not the fused lon/lat Gaspari–Cohn path: the numpy weights times the vertical."""
    vertical = {"radius": 300.0, "taper": "exponential"}
    want = reference_letkf(case, vertical, taper=taper)
    got = analysed(case, vertical, taper=taper)
    assert rel(got, want) <= 1e-10, rel(got, want)


def test_regulated_batched_equals_pointwise(case, tmp_path):
    """Regulated weights see the product of both tapers, the same in both kernels."""
    import shutil

    twin = tmp_path / "twin"
    shutil.copytree(case.root, twin)
    vertical = {"radius": 200.0}
    cfg = case.config(vertical)
    cfg["analysis"]["localization"]["regulated"] = True
    run_analysis(config_from_dict(cfg), MPI.COMM_SELF)
    batched = case.read_state()
    text = str(case.root)
    cfg2 = case.config(vertical, kernel="pointwise")
    cfg2["analysis"]["localization"]["regulated"] = True
    cfg2["ensemble"]["members"] = cfg2["ensemble"]["members"].replace(text, str(twin))
    cfg2["observations"] = [{**o, "file": o["file"].replace(text, str(twin))}
                            for o in cfg2["observations"]]  # fmt: skip
    run_analysis(config_from_dict(cfg2), MPI.COMM_SELF)
    case.root = twin
    pointwise = case.read_state()
    assert rel(batched, pointwise) <= 1e-12
    assert rel(batched, reference_letkf(case, vertical)) > 1e-6  # regulation did something


def test_lestkf_equals_the_letkf_reference(case):
    """ESTKF and ETKF give the same analysis (Nerger et al. 2012): the same reference."""
    vertical = {"radius": 150.0, "taper": "gaussian"}
    got = analysed(case, vertical, filter="lestkf")
    assert rel(got, reference_letkf(case, vertical)) <= 1e-10


def test_lenkf_equals_the_local_kalman_gain_update(case):
    """The stochastic local EnKF with the same 3-D weights; ε from the documented
    streams (seed, cycle, member, global id), centred over the members, times σ_o."""
    from ensio.analysis.transforms import obs_perturbations

    vertical = {"radius": 150.0}
    H, y, sig = stacked(case)
    z = obs_perturbations(5, 0, np.arange(case.k), np.arange(y.size))
    eps = (z - z.mean(0)) * sig
    want = kalman_gain_rows(case.X, H, y, sig, weights(case, vertical), eps)
    got = analysed(case, vertical, filter="lenkf", seed=5)
    assert rel(got, want) <= 1e-10, rel(got, want)


def test_without_vertical_key_equals_the_horizontal_reference(case):
    got = analysed(case, None)
    assert rel(got, reference_letkf(case, None)) <= 1e-10


def test_infinite_vertical_radius_is_horizontal_only(case):
    want = reference_letkf(case, None)
    got = analysed(case, {"radius": float("inf")})
    assert rel(got, want) <= 1e-10


def test_no_observation_leaves_the_members_unchanged(case):
    """An empty observation file with vertical localization: the prior, bit for bit."""
    empty = case.root / "empty.nc"
    write_obs(empty, {"lon": np.empty(0), "lat": np.empty(0),
                                     "level": np.empty(0), "value": np.empty(0),
                                     "error": np.empty(0)}, "temp")  # fmt: skip
    before = case.read_state()
    raw = case.config({"radius": 300.0})
    raw["observations"] = [str(empty)]
    run_analysis(config_from_dict(raw), MPI.COMM_SELF)
    assert np.array_equal(case.read_state(), before)


def test_vertical_weights_conventions():
    v = VerticalLocalization("gaspari-cohn", 200.0)
    a = np.array([0.0, 100.0, np.nan, np.inf, 50.0])
    b = np.array([0.0, 100.0, 200.0, np.nan])
    w = v.weights(a, b)
    assert w.shape == (5, 4)
    assert w[0, 0] == 1.0 and w[0, 2] == 0.0  # support radius: 0 at it
    assert w[0, 1] == pytest.approx(5.0 / 24.0)  # GC at half the support radius
    assert np.all(w[2] == 1.0) and np.all(w[3] == 1.0) and np.all(w[:, 3] == 1.0)  # no level
    for name in TAPER_NAMES:
        got = VerticalLocalization(name, 300.0).weights(DEPTH, DEPTH)
        want = vertical_taper(name, np.abs(DEPTH[:, None] - DEPTH[None, :]), 300.0)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


def test_localization_coords_keep_rows_without_level_together():
    loc = Localization(Geometry("lonlat"), radius=100.0, vertical=VerticalLocalization(radius=5.0))
    c = loc.coords(np.array([[1.0, 2.0, np.nan], [1.0, 2.0, np.nan], [1.0, 2.0, 3.0]]))
    assert np.unique(c, axis=0).shape[0] == 2
    h, lev = loc.split(c)
    assert h.shape == (3, 2) and lev[0] == np.inf and lev[2] == 3.0
    with pytest.raises(ValueError, match="lon/lat coordinates"):
        loc.coords(np.zeros((3, 2)))


def test_config_keys_and_errors():
    base = {"ensemble": {"members": "m{member}.nc", "size": 2, "variables": ["t"]}}

    def cfg(loc, **extra):
        return config_from_dict({**base, "analysis": {"filter": "letkf", "localization": loc,
                                                      **extra}})  # fmt: skip

    c = cfg({"radius_km": 500.0, "vertical": {"radius": 300.0, "taper": "step"}})
    v = c.analysis.localization.vertical
    assert (v.radius, v.taper) == (300.0, "step")
    v = cfg({"radius_km": 500.0, "vertical": {"radius": 30.0}}).analysis.localization.vertical
    assert v.taper == "gaspari-cohn"
    with pytest.raises(ConfigError, match=r"analysis\.localization\.vertical\.radius: must be > 0"):
        cfg({"radius_km": 500.0, "vertical": {"radius": -1.0}})
    with pytest.raises(ConfigError, match=r"analysis\.localization\.vertical"):
        cfg({"radius_km": 500.0, "vertical": {"radius": 1.0, "taper": "boxcar"}})
    with pytest.raises(ConfigError, match=r"analysis\.localization\.vertical"):
        cfg({"radius_km": 500.0, "vertical": {"taper": "step"}})
    with pytest.raises(ConfigError, match=r"weight_interpolation\.stride.*vertical"):
        cfg({"radius_km": 500.0, "vertical": {"radius": 1.0}}, weight_interpolation={"stride": 2})


def test_in_memory_api_with_a_level_column():
    """``ensio.analysis.analyse``: Euclidean ``radius``, the level as the last column of
    ``coords``, observations at the rows they index (with their level); rows without a
    level (NaN) weigh every observation by the horizontal taper alone."""
    rng = np.random.default_rng(draw_seed("vertical api"))
    k, ncol = 7, 25
    x = rng.uniform(0.0, 20.0, ncol)
    levels = np.array([0.0, 40.0, 90.0, np.nan])  # the last: a 2-D field's rows
    coords = np.array([[xi, lv] for lv in levels for xi in x])  # (n, 2): x, level
    n = coords.shape[0]
    X = rng.standard_normal((k, n)) + np.linspace(0, 3, n)
    idx = rng.choice(n, 30, replace=False)
    err = rng.uniform(0.5, 1.0, idx.size)
    y = X.mean(0)[idx] + rng.standard_normal(idx.size)
    obs = ObsBatch(y, err, np.zeros(idx.size), np.zeros(idx.size), index=idx)
    loc = LocalizationSection(radius=6.0, vertical=VerticalLocalizationSection(radius=70.0))
    got = analyse(X, obs, AnalysisSection("letkf", localization=loc), coords=coords).ensemble
    H = np.zeros((idx.size, n))
    H[np.arange(idx.size), idx] = 1.0
    dist = np.abs(coords[:, None, 0] - coords[None, idx, 0])
    dz = np.abs(coords[:, None, 1] - coords[None, idx, 1])
    wv = vertical_taper("gaspari-cohn", dz, 70.0)
    wv[np.isnan(dz)] = 1.0
    w = vertical_taper("gaspari-cohn", dist, 6.0) * wv
    want = letkf_rows(X, H, y, err, w)
    assert rel(got, want) <= 1e-10, rel(got, want)


def test_levels_of_rows_and_observations(case):
    """Scattered rows (a row set, the observed rows) get the levels of the layout's
    coordinates; observations their level value, else the level at their level_index,
    else their row's; none on a 2-D variable whatever their file says."""
    from ensio.analysis.vertical import levels_of_rows, observation_levels
    from ensio.io.scan.members import layout_from_member

    cfg = config_from_dict(case.config({"radius": 100.0}))
    layout = layout_from_member(cfg.ensemble, case.root / "mem001.nc")
    full = layout.coordinates(0, layout.n_rows)["level"]
    rng = np.random.default_rng(draw_seed("levels of rows"))
    for size in (1, 7, 300, layout.n_rows):
        rows = np.sort(rng.choice(layout.n_rows, size, replace=False))
        np.testing.assert_array_equal(levels_of_rows(layout, rows), full[rows])  # NaN == NaN
    nh = LAT.size * LON.size
    obs = ObsBatch(
        np.zeros(6), np.ones(6), np.zeros(6), np.zeros(6),
        index=np.array([-1, -1, -1, -1, 3 * nh + 5, DEPTH.size * nh + 2]),
        variable=np.array([0, 0, 1, 0, -1, -1]),
        level=np.array([123.0, np.nan, 50.0, 77.0, np.nan, np.nan]),
        level_index=np.array([-1, 2, -1, 4, -1, -1]),
    )  # fmt: skip
    got = observation_levels(obs, layout)
    want = [123.0, DEPTH[2], np.nan, DEPTH[4], DEPTH[3], np.nan]
    np.testing.assert_array_equal(got, want)
