"""Serial (N_mpi = 1) ensemble read/write: formats, dtypes, masks, bad input, the I/O object."""

from __future__ import annotations

import os

import netCDF4
import numpy as np
import pytest
from cases import EnsembleCase, VarCase, reference_matrix, sha256, variable_bytes
from mpi4py import MPI

from ensio.config import ConfigError, config_from_dict
from ensio.errors import InputError
from ensio.io.formats.netcdf4 import NetCDF4Store
from ensio.io.modes import files as files_mod
from ensio.io.modes.ensemble import ENSEMBLE_IO, open_ensemble, read_ensemble, write_ensemble
from ensio.io.modes.files import FileEnsembleIO
from ensio.io.scan import members as members_mod

SELF = MPI.COMM_SELF
SEED = 20240917  # every generator of this module derives from it (reproducible failures)

FORMATS = ["NETCDF4", "NETCDF3_64BIT_DATA", "NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET"]


def _case(fmt: str, dtype: str, endian: str = "native") -> EnsembleCase:
    nc4 = fmt == "NETCDF4"
    return EnsembleCase(
        members=4,
        fmt=fmt,
        seed=SEED,
        variables=[
            VarCase("state", ("lat", "lon"), dtype, endian),
            VarCase("t3", ("lev", "lat", "lon"), dtype, endian if nc4 else "native"),
            VarCase("soil", ("lev", "lat", "lon"), "f4", mask="landmask"),
        ]
        + ([VarCase("q", ("lev", "lat", "lon"), dtype, chunked=True)] if nc4 else []),
    )


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", ["f4", "f8"])
def test_roundtrip_identity_and_values(tmp_path, fmt, dtype):
    case = _case(fmt, dtype)
    paths = case.write(tmp_path)
    before = [sha256(p) for p in paths]
    cfg = config_from_dict(case.config(tmp_path))
    block = read_ensemble(cfg, SELF)
    np.testing.assert_array_equal(block.data, reference_matrix(paths, case.variables))
    stats = write_ensemble(cfg, SELF, block)
    assert [sha256(p) for p in paths] == before
    assert stats.state_bytes > 0
    assert not (tmp_path / ".ensio-journal").exists()


@pytest.mark.parametrize("endian", ["big", "little"])
def test_endianness(tmp_path, endian):
    case = _case("NETCDF4", "f8", endian)
    paths = case.write(tmp_path)
    before = [sha256(p) for p in paths]
    cfg = config_from_dict(case.config(tmp_path))
    block = read_ensemble(cfg, SELF)
    np.testing.assert_array_equal(block.data, reference_matrix(paths, case.variables))
    write_ensemble(cfg, SELF, block)
    assert [sha256(p) for p in paths] == before
    block.data[...] = -block.data  # exact in any float dtype
    write_ensemble(cfg, SELF, block)
    np.testing.assert_array_equal(reference_matrix(paths, case.variables), block.data)
    with netCDF4.Dataset(paths[0]) as ds:
        assert ds["state"].endian() == endian


@pytest.mark.parametrize("journal", [True, False])
def test_write_changes_only_state(tmp_path, journal):
    case = _case("NETCDF4", "f8")
    paths = case.write(tmp_path)
    aux = [variable_bytes(p, "aux") for p in paths]
    mask = [variable_bytes(p, "landmask") for p in paths]
    cfg = config_from_dict(case.config(tmp_path, journal=journal))
    block = read_ensemble(cfg, SELF)
    rng = np.random.default_rng(SEED + 1)
    block.data[...] = rng.standard_normal(block.data.shape)
    write_ensemble(cfg, SELF, block)
    np.testing.assert_allclose(reference_matrix(paths, case.variables), block.data, rtol=1e-6)
    assert [variable_bytes(p, "aux") for p in paths] == aux
    assert [variable_bytes(p, "landmask") for p in paths] == mask
    with netCDF4.Dataset(paths[0]) as ds:
        assert ds.title == "member 1" and ds["state"].long_name == "state variable state"


def _expect_error(tmp_path, cfg, match, exc=InputError):
    snap = {p: sha256(p) for p in sorted(tmp_path.glob("*.nc"))}
    with pytest.raises(exc) as err:
        read_ensemble(cfg, SELF)
    msg = str(err.value)
    assert "\n" not in msg
    assert match in msg, msg
    assert {p: sha256(p) for p in sorted(tmp_path.glob("*.nc"))} == snap
    return msg


def test_missing_member(tmp_path):
    case = _case("NETCDF4", "f8")
    paths = case.write(tmp_path)
    paths[2].unlink()
    _expect_error(tmp_path, config_from_dict(case.config(tmp_path)), str(paths[2]))


def test_member_with_other_dims_or_dtype(tmp_path):
    case = _case("NETCDF4", "f8")
    paths = case.write(tmp_path)
    other = EnsembleCase(members=1, nlat=8, variables=case.variables, seed=SEED + 3)
    other.write(tmp_path / "o")
    (tmp_path / "o" / "mem001.nc").replace(paths[1])
    msg = _expect_error(tmp_path, config_from_dict(case.config(tmp_path)), str(paths[1]))
    assert "state" in msg and "lat=8" in msg
    case32 = EnsembleCase(
        members=1,
        variables=[VarCase("state", ("lat", "lon"), "f4"), *case.variables[1:]],
        seed=SEED + 4,
    )
    case32.write(tmp_path / "d")
    (tmp_path / "d" / "mem001.nc").replace(paths[1])
    msg = _expect_error(tmp_path, config_from_dict(case.config(tmp_path)), str(paths[1]))
    assert "'state'" in msg and "float32" in msg


def test_absent_variable(tmp_path):
    case = _case("NETCDF4", "f8")
    case.write(tmp_path)
    raw = case.config(tmp_path)
    raw["ensemble"]["variables"] = ["state", "nope"]
    msg = _expect_error(tmp_path, config_from_dict(raw), "mem001.nc")
    assert "'nope'" in msg


def test_not_netcdf(tmp_path):
    case = _case("NETCDF4", "f8")
    paths = case.write(tmp_path)
    paths[3].write_bytes(np.random.default_rng(SEED + 2).bytes(4096))
    msg = _expect_error(tmp_path, config_from_dict(case.config(tmp_path)), str(paths[3]))
    assert "not a netCDF file" in msg


def test_truncated_netcdf(tmp_path):
    case = _case("NETCDF3_64BIT_DATA", "f8")
    paths = case.write(tmp_path)
    data = paths[1].read_bytes()
    paths[1].write_bytes(data[:40])
    _expect_error(tmp_path, config_from_dict(case.config(tmp_path)), str(paths[1]))


def test_too_many_io_tasks(tmp_path):
    case = _case("NETCDF4", "f8")
    case.write(tmp_path)
    with pytest.raises(ConfigError, match="^io.tasks: N_io = 2 exceeds"):
        read_ensemble(config_from_dict(case.config(tmp_path, tasks=2)), SELF)


def test_bad_member_leaves_files_untouched_on_write(tmp_path):
    case = _case("NETCDF4", "f8")
    paths = case.write(tmp_path)
    cfg = config_from_dict(case.config(tmp_path))
    block = read_ensemble(cfg, SELF)
    block.data[...] += 1.0
    paths[3].write_bytes(b"garbage" * 100)
    snap = [sha256(p) for p in paths]
    with pytest.raises(InputError, match="not a netCDF file"):
        write_ensemble(cfg, SELF, block)
    assert [sha256(p) for p in paths] == snap


# ----------------------------------------------------------------- the I/O object


def test_io_mode_selects_the_implementation(tmp_path):
    case = _case("NETCDF4", "f8")
    case.write(tmp_path)
    cfg = config_from_dict(case.config(tmp_path))
    assert cfg.io.mode == "files" and ENSEMBLE_IO["files"] is FileEnsembleIO
    with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, SELF) as ens:
        assert isinstance(ens, FileEnsembleIO)
        assert (ens.rows.start, ens.rows.count) == (0, ens.layout.n_rows)
        assert ens.group_rows.n_rows == ens.layout.n_rows and ens.n_io == 1
    raw = case.config(tmp_path, mode="tiles")
    with pytest.raises(ConfigError, match="^io.mode: 'tiles' is not one of files"):
        config_from_dict(raw)


def test_every_io_mode_has_an_implementation_and_a_config_value():
    from typing import get_args

    from ensio.config.schema import IOMode
    from ensio.io.modes.base import EnsembleIO

    # one registry: each mode's class decides itself how it opens tiled or untiled members
    assert set(ENSEMBLE_IO) == set(get_args(IOMode))
    assert all(issubclass(cls, EnsembleIO) for cls in ENSEMBLE_IO.values())


def test_object_reads_and_writes_without_reopening(tmp_path, monkeypatch):
    """Built once: later calls check each file with one stat, re-open only changed files."""
    case = _case("NETCDF4", "f8")
    paths = case.write(tmp_path)
    cfg = config_from_dict(case.config(tmp_path))
    opened = []
    real, first = members_mod.check_member, members_mod.member_template
    monkeypatch.setattr(
        members_mod, "check_member", lambda p, *a: opened.append(p) or real(p, *a)
    )
    # member 1 is checked fully once, as the template of the quick check
    monkeypatch.setattr(
        members_mod, "member_template", lambda p, *a: opened.append(p) or first(p, *a)
    )
    with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, SELF) as ens:
        assert opened == paths
        opened.clear()
        block = ens.read()
        assert ens.stats is not None and ens.stats.state_bytes > 0
        block.data[...] += 1.0
        stats = ens.write(block)
        assert stats is ens.stats and stats.state_bytes == ens.state_bytes
        # member files with a chunked (library-path) variable are replaced by a
        # rewritten copy: only those are checked again
        again = ens.read(out=block)
        assert again.data is block.data
        assert sorted(opened) == sorted(paths)  # every member has the chunked "q"
        np.testing.assert_array_equal(again.data, reference_matrix(paths, case.variables))
        opened.clear()
        ens.read()
        assert opened == []
        os.utime(paths[2], ns=(1, 1))  # someone else touched member 3
        ens.read()
        assert opened == [paths[2]]
    with pytest.raises(ValueError, match="after close"):
        ens.read()


def test_raw_byte_ranges_flag_is_honoured(tmp_path, monkeypatch):
    """A format without raw byte ranges reads everything through its library."""
    case = _case("NETCDF4", "f8")
    paths = case.write(tmp_path)
    cfg = config_from_dict(case.config(tmp_path))
    monkeypatch.setattr(NetCDF4Store, "raw_byte_ranges", False)
    calls = []
    monkeypatch.setattr(files_mod, "raw_read", lambda *a, **k: calls.append(a))
    block = read_ensemble(cfg, SELF)
    assert calls == []
    np.testing.assert_array_equal(block.data, reference_matrix(paths, case.variables))


def test_library_writes_flag_is_honoured(tmp_path, monkeypatch):
    """A library-path variable in a format without library writes: refused, nothing written."""
    case = _case("NETCDF4", "f8")  # has the chunked variable "q"
    paths = case.write(tmp_path)
    cfg = config_from_dict(case.config(tmp_path))
    block = read_ensemble(cfg, SELF)
    block.data[...] += 1.0
    monkeypatch.setattr(NetCDF4Store, "library_writes", False)
    snap = [sha256(p) for p in paths]
    with pytest.raises(InputError, match="'q' has no raw byte range"):
        write_ensemble(cfg, SELF, block)
    assert [sha256(p) for p in paths] == snap
    assert not (tmp_path / ".ensio-journal").exists()
