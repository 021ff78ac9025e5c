"""Dedicated restart writers: blocks of any decomposition → one member restart file."""

from __future__ import annotations

import netCDF4
import numpy as np
import pytest

from ensio.ioserver.restart import RestartAssembler, RestartError, RestartMeta


def _template(path, rng, shape=(3, 10, 14)):
    with netCDF4.Dataset(path, "w") as ds:
        for n, d in zip(("lev", "lat", "lon"), shape, strict=True):
            ds.createDimension(n, d)
        ds.createVariable("lon", "f8", ("lon",))[:] = np.arange(shape[2]) * 10.0
        v = ds.createVariable("temp", "f4", ("lev", "lat", "lon"))
        v[...] = rng.standard_normal(shape)
        v.units = "K"
        s = ds.createVariable("salt", "f8", ("lat", "lon"))
        s[...] = rng.standard_normal(shape[1:])
        ds.history = "written by the test"
    return shape


def _boxes(rng, shape, n):
    """``n`` irregular blocks tiling ``shape[-2:]`` (random cuts in both directions)."""
    cj = sorted(rng.choice(np.arange(1, shape[-2]), size=1, replace=False).tolist())
    ci = sorted(rng.choice(np.arange(1, shape[-1]), size=n // 2 - 1 if n > 2 else 1,
                           replace=False).tolist())
    js = [0, *cj, shape[-2]]
    is_ = [0, *ci, shape[-1]]
    return [(j0, j1, i0, i1) for j0, j1 in zip(js[:-1], js[1:], strict=True)
            for i0, i1 in zip(is_[:-1], is_[1:], strict=True)]


def test_blocks_of_any_decomposition_are_remapped_into_the_member_file(tmp_path, rng):
    template = tmp_path / "mem001_in.nc"
    shape = _template(template, rng)
    temp = rng.standard_normal(shape).astype("f4")
    salt = rng.standard_normal(shape[1:])
    boxes = _boxes(rng, shape, 4)
    asm = RestartAssembler(n_clients=len(boxes))
    out = tmp_path / "fc" / "mem001.nc"
    meta = RestartMeta(0, str(out), str(template), ("temp", "salt"))
    order = rng.permutation(len(boxes))
    for _ in order:
        asm.begin(meta)  # every rank announces it
    done = None
    for c in order:
        j0, j1, i0, i1 = boxes[c]
        asm.part(0, "salt", (j0, i0), salt[j0:j1, i0:i1], c)
        asm.part(0, "temp", (0, j0, i0), temp[:, j0:j1, i0:i1], c)
        done = asm.end(0, c)
    assert done == out and asm.incomplete == []
    with netCDF4.Dataset(out) as ds, netCDF4.Dataset(template) as tp:
        np.testing.assert_array_equal(ds["temp"][...], temp)
        np.testing.assert_array_equal(ds["salt"][...], salt)
        np.testing.assert_array_equal(ds["lon"][...], tp["lon"][...])
        assert ds["temp"].units == "K" and ds.history == "written by the test"
    assert not list(out.parent.glob(".*ensio-tmp*"))


def test_a_gap_an_overlap_or_a_block_outside_is_refused_and_nothing_is_written(tmp_path, rng):
    template = tmp_path / "t.nc"
    shape = _template(template, rng)
    out = tmp_path / "out.nc"
    meta = RestartMeta(3, str(out), str(template), ("salt",))
    asm = RestartAssembler(2)
    asm.begin(meta)
    asm.part(3, "salt", (0, 0), np.zeros((5, shape[2])), 0)
    with pytest.raises(RestartError, match="overlaps"):
        asm.part(3, "salt", (4, 0), np.zeros((2, shape[2])), 1)
    with pytest.raises(RestartError, match="outside"):
        asm.part(3, "salt", (6, 0), np.zeros((5, shape[2])), 1)
    with pytest.raises(RestartError, match="not one of the restart variables"):
        asm.part(3, "temp", (0, 0, 0), np.zeros(shape), 1)
    asm.end(3, 0)
    asm.part(3, "salt", (5, 0), np.zeros((3, shape[2])), 1)
    gap = (shape[1] - 8) * shape[2]  # rows 8.. were sent by nobody
    with pytest.raises(RestartError, match=rf"{gap} points of salt were sent by no model rank"):
        asm.end(3, 1)
    assert not out.exists()
    with pytest.raises(RestartError, match="no variable 'nope'"):
        asm.begin(RestartMeta(4, str(out), str(template), ("nope",)))



def test_restart_part_messages_carry_start_counts_and_the_block_exactly(rng):
    from ensio.ioserver.protocol import DType, Kind, decode, restart_part, split_restart_part

    for dtype, wire in (("f4", DType.F32), ("f8", DType.F64), ("i4", DType.F64)):
        block = (rng.standard_normal((2, 3, 5)) * 1000).astype(dtype)
        header, payload = decode(restart_part(7, "temp", (1, 4, 9), block))
        assert (header.kind, header.a[:2], header.name, header.dtype) == (
            Kind.RESTART_PART, (7, 3), "temp", wire)
        start, got = split_restart_part(header, payload)
        assert start == (1, 4, 9)
        np.testing.assert_array_equal(got, block)
    big = np.zeros((1, 2), "f4")  # an index float32 cannot hold exactly: sent as float64
    header, payload = decode(restart_part(0, "s", (2**24 + 1, 0), big))
    assert header.dtype == DType.F64 and split_restart_part(header, payload)[0] == (2**24 + 1, 0)
