"""Observations exactly on ocean points next to land (issue 26, item 2: the coast bug).

On a NEMO-style grid (2-D ``nav_lon``/``nav_lat``, a land mask ``tmask``) an
observation placed exactly on an ocean grid point got, from the curvilinear
cell search (Newton's method in a gnomonic projection), weights of ~1e-16 on
the corners it does not touch; a land corner with such a weight rejected it
(``outside`` on a masked variable, ``missing_state`` where land holds missing
values). The same grid given as 1-D lon/lat rejected none. Expected here:
no observation rejected, H equal on both grids to 1e-12 (it is the identity
on the observed point, weight exactly 1), every untouched corner weight
exactly 0.
"""

from __future__ import annotations

from pathlib import Path

import netCDF4
import numpy as np
import pytest
from mpi4py import MPI
from seeds import draw_seed

from ensio.config import config_from_dict
from ensio.io.scan.members import layout_from_member
from ensio.layout.block import EnsembleBlock
from ensio.obs import ObsBatch, StateGrid, build_operator, cells

NY, NX = 17, 23


def nemo_grid():
    """Regional grid, 2° in longitude, Mercator-spaced latitudes (as ORCA's)."""
    lon = -30.0 + 2.0 * np.arange(NX)
    y = np.radians(2.0) * (np.arange(NY) - 4)
    lat = np.degrees(np.arctan(np.sinh(y)))
    return lon, lat


def write_member(path: Path, lon, lat, sea, field, *, two_d: bool, land_fill: bool) -> Path:
    """One member: ``sst`` with ``tmask``; on land the fill value when ``land_fill``."""
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("y", NY)
        ds.createDimension("x", NX)
        if two_d:
            L, B = np.meshgrid(lon, lat)
            for name, v, units in (("nav_lon", L, "degrees_east"), ("nav_lat", B, "degrees_north")):
                var = ds.createVariable(name, "f8", ("y", "x"))
                var[:] = v
                var.units = units
        else:
            ds.createDimension("lon", NX)  # unused: 1-D coordinates on x and y
            for name, dim, v, units in (("lon", "x", lon, "degrees_east"),
                                        ("lat", "y", lat, "degrees_north")):  # fmt: skip
                var = ds.createVariable(name, "f8", (dim,))
                var[:] = v
                var.units = units
        m = ds.createVariable("tmask", "i1", ("y", "x"))
        m[:] = sea
        kw = {"fill_value": 1e20} if land_fill else {}
        v = ds.createVariable("sst", "f8", ("y", "x"), **kw)
        v.set_auto_maskandscale(False)
        v[:] = np.where(sea | (not land_fill), field, 1e20)
    return path


def coastal_points(sea: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(j, i) of ocean points with land among their 8 neighbours, off the grid's edge."""
    land = ~sea
    near = np.zeros_like(land)
    for dj in (-1, 0, 1):
        for di in (-1, 0, 1):
            near[1:-1, 1:-1] |= land[1 + dj : NY - 1 + dj, 1 + di : NX - 1 + di]
    near[[0, -1], :] = False
    near[:, [0, -1]] = False
    return np.nonzero(sea & near)


def _layout(root: Path, two_d: bool, masked: bool, **write):
    coords = {"lon": "nav_lon", "lat": "nav_lat"} if two_d else {"lon": "lon", "lat": "lat"}
    var = {"name": "sst", "mask": "tmask"} if masked else "sst"
    raw = {"ensemble": {"members": str(root / "mem{member:03d}.nc"), "size": 1,
                        "variables": [var], "coordinates": coords}}  # fmt: skip
    return layout_from_member(config_from_dict(raw).ensemble, root / "mem001.nc")


@pytest.fixture()
def coast(tmp_path):
    rng = np.random.default_rng(draw_seed("test_obs_coast"))
    lon, lat = nemo_grid()
    sea = rng.random((NY, NX)) > 0.35
    field = rng.standard_normal((NY, NX))
    j, i = coastal_points(sea)
    assert j.size > 20
    obs = ObsBatch(field[j, i], np.ones(j.size), lon[i], lat[j])
    return tmp_path, lon, lat, sea, field, obs, (j, i)


def dense_h(op, n: int) -> np.ndarray:
    H = np.zeros((len(op), n))
    for o in range(len(op)):
        np.add.at(H[o], op.rows[o], op.weights[o])
    return H


@pytest.mark.parametrize("masked", [True, False], ids=["masked", "land-fill"])
def test_observations_on_coastal_points_are_kept_on_both_grids(coast, masked):
    root, lon, lat, sea, field, obs, (j, i) = coast
    H = {}
    for two_d in (True, False):
        d = root / ("2d" if two_d else "1d")
        d.mkdir()
        write_member(d / "mem001.nc", lon, lat, sea, field, two_d=two_d, land_fill=not masked)
        layout = _layout(d, two_d, masked)
        assert layout.geometry.grid.curvilinear is two_d
        op, inside = build_operator(obs, layout.n_rows, StateGrid(layout))
        assert inside.all(), f"{(~inside).sum()} of {len(obs)} rejected (2-D: {two_d})"
        w = op.weights
        assert np.all((w == 0.0) | (w == 1.0)), np.unique(w)  # zero to rounding is 0
        assert np.all((w != 0.0).sum(axis=1) == 1)
        H[two_d] = dense_h(op, layout.n_rows)
        # the one row it reads is its own point's
        rows = np.flatnonzero(sea.ravel()) if masked else np.arange(sea.size)
        read = rows[op.rows[np.arange(len(op)), np.argmax(w, axis=1)]]
        np.testing.assert_array_equal(read, j * NX + i)
    assert np.abs(H[True] - H[False]).max() <= 1e-12


def test_without_snapping_the_2d_grid_puts_rounding_weights_on_land(coast, monkeypatch):
    """The test above can fail: with no snapping the bug is back (the untouched corners
    get weights of rounding size, not 0)."""
    root, lon, lat, sea, field, obs, _ = coast
    write_member(root / "mem001.nc", lon, lat, sea, field, two_d=True, land_fill=False)
    layout = _layout(root, True, True)
    monkeypatch.setattr(cells, "SNAP", 0.0)
    op, inside = build_operator(obs, layout.n_rows, StateGrid(layout))
    tiny = (op.weights != 0.0) & (np.abs(op.weights) < 1e-12)
    assert tiny.any() or not inside.all()


def test_no_missing_state_in_the_analysis_next_to_land(coast):
    """End to end: land holds the fill value (inactive rows), every coastal observation
    is accepted by the analysis's quality control, none as ``missing_state``."""
    from ensio.analysis.pipeline import AnalysisSettings, analyse_rows
    from ensio.config.analysis import AnalysisSection, LocalizationSection

    root, lon, lat, sea, field, obs, _ = coast
    write_member(root / "mem001.nc", lon, lat, sea, field, two_d=True, land_fill=True)
    layout = _layout(root, True, False)
    rng = np.random.default_rng(draw_seed("test_no_missing_state"))
    k = 6
    X = field.ravel()[None, :] + 0.3 * rng.standard_normal((k, layout.n_rows))
    X[:, ~sea.ravel()] = np.nan  # land: missing in every member
    cfg = AnalysisSection("letkf", localization=LocalizationSection(radius_km=800.0))
    block = EnsembleBlock(layout, 0, layout.n_rows, X)
    res = analyse_rows(block, obs, AnalysisSettings(cfg), MPI.COMM_SELF)
    assert res.qc.missing_state == 0 and res.qc.outside == 0
    assert res.qc.accepted == len(obs)
    assert np.isnan(res.ensemble[:, ~sea.ravel()]).all()
    assert np.isfinite(res.ensemble[:, sea.ravel()]).all()


def test_snap_fraction_is_exact_at_the_ends():
    t = np.array([0.0, 1e-16, -1e-16, 0.5, 1 - 1e-16, 1.0, 1 + 1e-16, 1e-9])
    got = cells.snap_fraction(t)
    np.testing.assert_array_equal(got, [0, 0, 0, 0.5, 1, 1, 1, 1e-9])
