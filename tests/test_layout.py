import numpy as np
import pytest

from ensio.config import Coordinates, VariableSpec
from ensio.errors import InputError
from ensio.layout import VarMeta, block_distribution, build_layout


@pytest.mark.parametrize("n", [0, 1, 7, 100, 101])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
def test_block_distribution_partitions(n, size):
    blocks = [block_distribution(n, size, r) for r in range(size)]
    assert sum(c for _, c in blocks) == n
    assert blocks[0][0] == 0
    for (s0, c0), (s1, _) in zip(blocks, blocks[1:], strict=False):
        assert s0 + c0 == s1
    assert max(c for _, c in blocks) == -(-n // size)


def _layout(rng, mask_frac=0.4):
    nlev, nlat, nlon = 3, 5, 8
    land = rng.random((nlat, nlon)) < mask_frac
    land[2, 3] = True
    metas = {
        "a": VarMeta("a", ("lat", "lon"), (nlat, nlon), np.dtype(">f4")),
        "b": VarMeta("b", ("lev", "lat", "lon"), (nlev, nlat, nlon), np.dtype("f8")),
        "land": VarMeta("land", ("lat", "lon"), (nlat, nlon), np.dtype("i1")),
        "lon": VarMeta("lon", ("lon",), (nlon,), np.dtype("f8")),
        "lat": VarMeta("lat", ("lat",), (nlat,), np.dtype("f8")),
    }
    values = {
        "land": land.astype("i1"),
        "lon": np.arange(nlon) * 45.0,
        "lat": np.linspace(-80, 80, nlat),
    }
    specs = [VariableSpec("a"), VariableSpec("b", mask="land")]
    return build_layout(specs, metas, values.__getitem__, Coordinates(), "f.nc"), land, values


def test_rows_segments_and_coordinates():
    rng = np.random.default_rng(2024)  # fixed: the test must not depend on the draw
    layout, land, values = _layout(rng)
    nland = int(land.sum())
    assert layout.n_rows == 40 + 3 * nland
    b = layout.variable("b")
    assert b.offset == 40 and b.size == 3 * nland and b.dtype == np.dtype("f8")
    assert layout.variable("a").dtype == np.dtype("f4")  # native order in memory
    # reference: every row's (var, element) in the plainest way
    ref = [("a", e) for e in range(40)]
    full = np.broadcast_to(land, (3, 5, 8)).ravel()
    ref += [("b", e) for e in range(120) if full[e]]
    for lo in range(0, layout.n_rows):
        hi = int(rng.integers(lo + 1, layout.n_rows + 1))
        got = []
        for seg in layout.segments(lo, hi):
            v = layout.variables[seg.var]
            elems = np.arange(seg.elem_lo, seg.elem_hi)
            if seg.select is not None:
                elems = elems[seg.select]
            assert len(elems) == seg.n_rows
            got += [(v.name, int(e)) for e in elems]
        assert got == ref[lo:hi]
    c = layout.coordinates(0, layout.n_rows)
    lat_idx = [np.unravel_index(e, (5, 8) if n == "a" else (3, 5, 8))[-2] for n, e in ref]
    lon_idx = [np.unravel_index(e, (5, 8) if n == "a" else (3, 5, 8))[-1] for n, e in ref]
    np.testing.assert_array_equal(c["lat"], values["lat"][lat_idx])
    np.testing.assert_array_equal(c["lon"], values["lon"][lon_idx])


def test_layout_errors_name_variable():
    metas = {"a": VarMeta("a", ("x",), (4,), np.dtype("i4"))}
    with pytest.raises(InputError, match="f.nc: state variable 'a' has dtype int32"):
        build_layout([VariableSpec("a")], metas, lambda n: None, Coordinates(), "f.nc")
    with pytest.raises(InputError, match="f.nc: state variable 'zz' not found"):
        build_layout([VariableSpec("zz")], metas, lambda n: None, Coordinates(), "f.nc")
    metas["a"] = VarMeta("a", ("x",), (4,), np.dtype("f4"))
    with pytest.raises(InputError, match="mask variable 'm' not found"):
        build_layout([VariableSpec("a", mask="m")], metas, lambda n: None, Coordinates(), "f.nc")
