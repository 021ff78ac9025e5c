"""Issue 26: state rows of model restarts = interior x state time level x mask, placed right.

A Veros-like restart (tests/veros_like.py: (x + 2h, y + 2h, z, 3), unnamed dims) with its
grid file: the layout's rows and coordinates equal an independent enumeration written here
(C order of the stored array, x slowest; ocean points of the grid's mask; lon = xt[i],
lat = yt[j], level = zt[k]); a mask in another axis order or on a subset of the dims
gives the same rows; a member's own coordinates and mask (stored with halo) are cut to
the interior; every malformed case is one InputError naming the file and the key.
"""

from __future__ import annotations

import numpy as np
import pytest
from netCDF4 import Dataset
from seeds import draw_seed
from veros_like import grid_axes, write_grid_file, write_veros_like

from ensio.config.load import config_from_dict
from ensio.errors import InputError
from ensio.io.scan.members import MemberScan, layout_from_member
from ensio.layout.index import state_index

DIMS = ["xt", "yt", "zt", "level"]


def _ensemble(tmp_path, **over):
    ens = {"members": str(tmp_path / "m{member:02d}.h5"), "size": 2, "dims": DIMS,
           "halo": {"xt": 2, "yt": 2}, "time_level": {"dim": "level", "from": "core/tau"},
           "grid": str(tmp_path / "grid.nc"),
           "coordinates": {"lon": "xt", "lat": "yt", "level": "zt"},
           "variables": [{"name": "core/temp", "mask": "maskT"}]}
    ens.update(over)
    return config_from_dict({"ensemble": ens}).ensemble


def _case(tmp_path, seed_label):
    rng = np.random.default_rng(draw_seed(seed_label))
    nx, ny, nz = (int(v) for v in rng.integers(5, 9, 3))
    h, tau = int(rng.integers(1, 3)), int(rng.integers(0, 3))
    land = rng.random((nx, ny, nz)) < 0.3
    for m in (1, 2):
        write_veros_like(tmp_path / f"m{m:02d}.h5", nx=nx, ny=ny, nz=nz, halo=h, tau=tau,
                         seed=int(rng.integers(1 << 30)), land=land)
    write_grid_file(tmp_path / "grid.nc", nx=nx, ny=ny, nz=nz, land=land)
    return nx, ny, nz, h, tau, land


def _expected(nx, ny, nz, h, tau, land):
    """Independent enumeration: stored elements, lon, lat, level of every state row."""
    xt, yt, zt = grid_axes(nx, ny, nz)
    shape = (nx + 2 * h, ny + 2 * h, nz, 3)
    elems, lon, lat, lev = [], [], [], []
    for i in range(nx):
        for j in range(ny):
            for k in range(nz):
                if not land[i, j, k]:
                    elems.append(((i + h) * shape[1] + j + h) * shape[2] * 3 + k * 3 + tau)
                    lon.append(xt[i])
                    lat.append(yt[j])
                    lev.append(zt[k])
    return np.array(elems), np.array(lon), np.array(lat), np.array(lev)


def test_rows_and_coordinates_of_a_veros_restart(tmp_path):
    nx, ny, nz, h, tau, land = _case(tmp_path, "veros layout")
    ens = _ensemble(tmp_path, halo={"xt": h, "yt": h})
    layout = layout_from_member(ens, tmp_path / "m01.h5")
    elems, lon, lat, lev = _expected(nx, ny, nz, h, tau, land)
    v = layout.variables[0]
    assert v.shape == (nx + 2 * h, ny + 2 * h, nz, 3) and v.dims == tuple(DIMS)
    assert layout.n_rows == v.size == elems.size
    np.testing.assert_array_equal(v.element_indices(0, v.size), elems)
    c = layout.coordinates(0, layout.n_rows)
    np.testing.assert_array_equal(c["lon"], lon)
    np.testing.assert_array_equal(c["lat"], lat)
    np.testing.assert_array_equal(c["level"], lev)
    # a part of the rows (what a rank asks for) too
    lo, hi = layout.n_rows // 3, layout.n_rows // 3 + 7
    np.testing.assert_array_equal(layout.coordinates(lo, hi)["lat"], lat[lo:hi])
    # ensio index: the row of an ocean grid point at its level
    xt, yt, zt = grid_axes(nx, ny, nz)
    i, j, k = np.argwhere(~land)[len(elems) // 2]
    row = int(state_index(layout, xt[i], yt[j], level_index=int(k)))
    assert (lon[row], lat[row], lev[row]) == (xt[i], yt[j], zt[k])
    # both members agree on tau: the scan accepts them
    from mpi4py import MPI
    MemberScan([tmp_path / "m01.h5", tmp_path / "m02.h5"], layout, MPI.COMM_SELF)


def test_fixed_index_and_unmasked(tmp_path):
    nx, ny, nz, h, _, _ = _case(tmp_path, "veros fixed level")
    ens = _ensemble(tmp_path, halo={"xt": h, "yt": h}, time_level={"dim": "level", "index": 2},
                    variables=["core/temp"])
    layout = layout_from_member(ens, tmp_path / "m01.h5")
    elems, *_ = _expected(nx, ny, nz, h, 2, np.zeros((nx, ny, nz), bool))
    np.testing.assert_array_equal(layout.variables[0].element_indices(0, layout.n_rows), elems)


def _grid(tmp_path, nx, ny, nz, mask, mask_dims, name="grid2.nc"):
    xt, yt, zt = grid_axes(nx, ny, nz)
    with Dataset(tmp_path / name, "w") as ds:
        for d, values in (("xt", xt), ("yt", yt), ("zt", zt)):
            ds.createDimension(d, len(values))
            ds.createVariable(d, "f8", (d,))[:] = values
        ds.createVariable("maskT", "i1", mask_dims)[:] = mask
    return str(tmp_path / name)


def test_mask_in_any_axis_order_or_on_a_subset(tmp_path):
    nx, ny, nz, h, tau, land = _case(tmp_path, "veros mask order")
    want = layout_from_member(_ensemble(tmp_path, halo={"xt": h, "yt": h}),
                              tmp_path / "m01.h5")
    path = _grid(tmp_path, nx, ny, nz, (~land).astype(np.int8), ("xt", "yt", "zt"))
    got = layout_from_member(_ensemble(tmp_path, halo={"xt": h, "yt": h}, grid=path),
                             tmp_path / "m01.h5")
    np.testing.assert_array_equal(got.variables[0].active, want.variables[0].active)
    # a 2-D (yt, xt) mask: the surface's land, broadcast over every level
    surface = ~land[:, :, -1]
    path = _grid(tmp_path, nx, ny, nz, surface.T.astype(np.int8), ("yt", "xt"), "grid3.nc")
    got = layout_from_member(_ensemble(tmp_path, halo={"xt": h, "yt": h}, grid=path),
                             tmp_path / "m01.h5")
    elems, *_ = _expected(nx, ny, nz, h, tau, np.repeat(~surface[:, :, None], nz, axis=2))
    np.testing.assert_array_equal(got.variables[0].active, elems)
    # as model output has it: (Time, zt, yt, xt) with a record dimension of length 1
    xt, yt, zt = grid_axes(nx, ny, nz)
    with Dataset(tmp_path / "snapshot.nc", "w") as ds:
        for d, values in (("xt", xt), ("yt", yt), ("zt", zt)):
            ds.createDimension(d, len(values))
            ds.createVariable(d, "f8", (d,))[:] = values
        ds.createDimension("Time", None)
        ds.createVariable("maskT", "i1", ("Time", "zt", "yt", "xt"))[:] = (
            np.transpose(~land, (2, 1, 0))[None].astype(np.int8))
    got = layout_from_member(_ensemble(tmp_path, halo={"xt": h, "yt": h},
                                       grid=str(tmp_path / "snapshot.nc")), tmp_path / "m01.h5")
    np.testing.assert_array_equal(got.variables[0].active, want.variables[0].active)


def test_coordinates_and_mask_from_the_member_cut_to_the_interior(tmp_path):
    """A netCDF-4 restart with named dims carrying its own lon/lat/depth and mask with halo."""
    rng = np.random.default_rng(draw_seed("member coordinates"))
    nx, ny, nz, h, lev = 6, 5, 3, 2, 1
    lon = np.sort(rng.uniform(0, 300, nx + 2 * h))
    lat = np.sort(rng.uniform(-60, 60, ny + 2 * h))
    depth = np.array([5.0, 50.0, 500.0])
    mask = rng.random((ny + 2 * h, nx + 2 * h)) < 0.7
    path = tmp_path / "r01.nc"
    with Dataset(path, "w") as ds:
        for d, n in (("t", 2), ("z", nz), ("y", ny + 2 * h), ("x", nx + 2 * h)):
            ds.createDimension(d, n)
        ds.createVariable("x", "f8", ("x",))[:] = lon
        ds.createVariable("y", "f8", ("y",))[:] = lat
        ds.createVariable("z", "f8", ("z",))[:] = depth
        ds.createVariable("tmask", "i1", ("y", "x"))[:] = mask
        tn = ds.createVariable("tn", "f8", ("t", "z", "y", "x"))
        tn[:] = rng.normal(size=(2, nz, ny + 2 * h, nx + 2 * h))
    ens = config_from_dict({"ensemble": {
        "members": str(tmp_path / "r{member:02d}.nc"), "size": 1, "halo": {"x": h, "y": h},
        "time_level": {"dim": "t", "index": lev}, "variables": [{"name": "tn", "mask": "tmask"}],
        "coordinates": {"lon": "x", "lat": "y", "level": "z"}}}).ensemble
    layout = layout_from_member(ens, path)
    want_e, want_lon, want_lat, want_z = [], [], [], []
    for k in range(nz):
        for j in range(h, ny + h):
            for i in range(h, nx + h):
                if mask[j, i]:
                    want_e.append(((lev * nz + k) * (ny + 2 * h) + j) * (nx + 2 * h) + i)
                    want_lon.append(lon[i])
                    want_lat.append(lat[j])
                    want_z.append(depth[k])
    np.testing.assert_array_equal(layout.variables[0].active, want_e)
    c = layout.coordinates(0, layout.n_rows)
    np.testing.assert_array_equal(c["lon"], want_lon)
    np.testing.assert_array_equal(c["lat"], want_lat)
    np.testing.assert_array_equal(c["level"], want_z)
    # the members repeat their coordinates as stored (with halo)
    assert {c.name: c.values.shape for c in layout.geometry.checked} == {
        "x": (nx + 2 * h,), "y": (ny + 2 * h,), "z": (nz,)}


def _error(fn) -> str:
    with pytest.raises(InputError) as err:
        fn()
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_malformed_restarts_name_file_and_key(tmp_path):
    nx, ny, nz, h, tau, land = _case(tmp_path, "veros errors")
    m1, m2 = tmp_path / "m01.h5", tmp_path / "m02.h5"

    def layout(**over):
        return layout_from_member(_ensemble(tmp_path, **{"halo": {"xt": h, "yt": h}, **over}),
                                  m1)

    half = (nx + 2 * h + 1) // 2
    msg = _error(lambda: layout(halo={"xt": half, "yt": h}))
    assert str(m1) in msg and "ensemble.halo.xt" in msg
    msg = _error(lambda: layout(dims=None))  # the file's own (phony) names: no xt
    assert str(m1) in msg and "ensemble.halo.xt" in msg and "ensemble.dims" in msg
    msg = _error(lambda: layout(time_level={"dim": "level", "from": "core/tau_now"}))
    assert str(m1) in msg and "ensemble.time_level.from" in msg and "core/tau_now" in msg
    msg = _error(lambda: layout(time_level={"dim": "level", "from": "core/temp"}))
    assert "ensemble.time_level.from" in msg and "not a scalar integer" in msg
    msg = _error(lambda: layout(time_level={"dim": "level", "index": 3}))
    assert str(m1) in msg and "ensemble.time_level.index" in msg and "0..2" in msg
    msg = _error(lambda: layout(variables=["core/missing"]))
    assert str(m1) in msg and "core/missing" in msg
    msg = _error(lambda: layout(dims=["xt", "yt", "zt"], time_level=None))
    assert str(m1) in msg and "ensemble.dims" in msg
    msg = _error(lambda: layout(grid=str(tmp_path / "nogrid.nc")))
    assert "nogrid.nc" in msg and "ensemble.grid" in msg
    bad = _grid(tmp_path, nx + 1, ny, nz, np.ones((nz, ny, nx + 1), np.int8),
                ("zt", "yt", "xt"), "bad.nc")
    msg = _error(lambda: layout(grid=bad))
    assert "bad.nc" in msg and str(m1) in msg and "ensemble.grid" in msg and "xt" in msg
    assert "maskT" in msg  # the mask is the first thing read from the grid
    bad = _grid(tmp_path, nx + 1, ny, nz, np.ones((ny, nx + 1), np.int8), ("yt", "xt"),
                "bad2.nc")
    msg = _error(lambda: layout(grid=bad, variables=["core/temp"]))  # the coordinates' turn
    assert "bad2.nc" in msg and str(m1) in msg and "ensemble.grid" in msg and "'xt'" in msg
    # member 2 at another time level than member 1
    write_veros_like(m2, nx=nx, ny=ny, nz=nz, halo=h, tau=tau + 1, land=land)
    from mpi4py import MPI
    lay = layout()
    msg = _error(lambda: MemberScan([m1, m2], lay, MPI.COMM_SELF))
    assert str(m1) in msg and str(m2) in msg and "ensemble.time_level.from" in msg
    assert "core/tau" in msg



def test_a_2d_variable_with_its_own_dims(tmp_path):
    """core/psi (x, y, level) beside core/temp: its own ``dims``, the same halo and level."""
    nx, ny, nz, h, tau, land = _case(tmp_path, "veros psi")
    ens = _ensemble(tmp_path, halo={"xt": h, "yt": h}, variables=[
        {"name": "core/temp", "mask": "maskT"},
        {"name": "core/psi", "dims": ["xt", "yt", "level"]}])
    layout = layout_from_member(ens, tmp_path / "m01.h5")
    temp, psi = layout.variables
    elems, *_ = _expected(nx, ny, nz, h, tau, land)
    assert temp.size == elems.size and psi.offset == elems.size
    xt, yt, _ = grid_axes(nx, ny, nz)
    want = [((i + h) * (ny + 2 * h) + j + h) * 3 + tau for i in range(nx) for j in range(ny)]
    np.testing.assert_array_equal(psi.element_indices(0, psi.size), want)
    c = layout.coordinates(psi.offset, psi.offset + psi.size)
    np.testing.assert_array_equal(c["lon"], np.repeat(xt, ny))
    np.testing.assert_array_equal(c["lat"], np.tile(yt, nx))
    assert np.isnan(c["level"]).all()
