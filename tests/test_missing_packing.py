"""Missing values and packed variables (issue 10 items 1, 2): serial and `ensio analyse`.

Members come from tests/missing_cases.py (NCO-packed, CF-masked); expected
values from netCDF4-python's own unpacking and a numpy ETKF on the active
points, never from ensio.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import needs
import netCDF4
import numpy as np
import pytest
from missing_cases import (
    NAMES,
    TOOLS,
    check_analysis,
    config,
    make_obs,
    read_physical,
    read_stored,
    sizes,
    write_members,
    write_obs,
)
from mpi4py import MPI

from ensio.config import load_config
from ensio.io.modes.ensemble import open_ensemble
from ensio.layout.encoding import Encoding

ENSIO = [sys.executable, "-m", "ensio"]
FORMATS = ("NETCDF4", "NETCDF3_64BIT_OFFSET")

needs_nco = needs.tools_mark(*TOOLS)  # NCO (and nccopy)


def _sha(paths: list[Path]) -> list[bytes]:
    return [p.read_bytes() for p in paths]


# --------------------------------------------------------------------------- the rules


def test_encoding_rules_follow_netcdf_and_cf():
    short = np.dtype("i2")
    # no _FillValue: the default fill of the type is missing, not for bytes
    assert Encoding.from_attributes(short, {}).fill == -32767
    assert Encoding.from_attributes(np.dtype("i1"), {}).fill is None
    assert Encoding.from_attributes(np.dtype("u1"), {}).fill is None
    # an attribute the stored type cannot hold matches nothing
    enc = Encoding.from_attributes(short, {"_FillValue": np.array([-9e33], "f4")})
    assert enc.fill is None
    enc = Encoding.from_attributes(
        short,
        {
            "missing_value": np.array([-1, 5, 1e9]),
            "valid_range": np.array([-100, 100], "i2"),
            "valid_min": np.array([-5], "i2"),
        },
    )
    assert enc.missing == (-1, 5) and (enc.valid_min, enc.valid_max) == (-100, 100)
    raw = np.array([-101, -100, -32767, -1, 0, 5, 100, 101], "i2")
    expect = [True, False, True, True, False, True, False, True]
    np.testing.assert_array_equal(enc.missing_mask(raw), expect)
    f4 = Encoding.from_attributes(np.dtype(">f4"), {"_FillValue": np.array([np.nan], "f4")})
    np.testing.assert_array_equal(
        f4.missing_mask(np.array([1.0, np.nan, np.inf, 9.96921e36], ">f4")),
        [False, True, True, False],  # an explicit _FillValue replaces the default one
    )


def test_decode_and_encode_against_hand_values():
    enc = Encoding.from_attributes(
        np.dtype("i2"),
        {"scale_factor": np.array([0.5]), "add_offset": np.array([10.0]),
         "_FillValue": np.array([0], "i2")},
    )  # fmt: skip
    raw = np.array([-2, 0, 3, 32767], "i2")
    out = np.empty(4)
    enc.decode(raw, out)
    np.testing.assert_array_equal(out, [9.0, np.nan, 11.5, 32767 * 0.5 + 10.0])
    x = np.array([10.24, 10.26, 10.0, 9.9, 1e6, -1e6, np.nan])
    new = np.empty(7, ">i2")
    clips = enc.encode(x, new)
    # 0.48 → 0, which is the fill: moved to 1; 0.52 → 1; 0 → fill → 1; -0.2 → -0 → fill → 1
    np.testing.assert_array_equal(new[:6], [1, 1, 1, 1, 32767, -32768])
    assert clips == 2 + 3  # two beyond the type, three moved off the fill value
    prior = np.array([7, 8, 9, 10, 11, 12, 13], ">i2")
    enc.keep_prior(prior, x, new)
    assert new[6] == 13  # non-finite: the prior bytes stay
    # a float with add_offset only: unchanged values keep their exact bytes
    f = Encoding.from_attributes(np.dtype("f4"), {"add_offset": np.array([273.15], "f4")})
    stored = np.array([1e-7, -3.25, 0.1], "f4")
    phys = np.empty(3)
    f.decode(stored, phys)
    new = np.empty(3, "f4")
    f.encode(phys, new)
    f.keep_prior(stored, phys, new)
    assert new.tobytes() == stored.tobytes()


# --------------------------------------------------------------------------- files


@needs_nco
@pytest.mark.parametrize("fmt", FORMATS)
def test_read_unpacks_masks_and_identity_write_is_byte_identical(fmt, tmp_path, rng):
    mem = write_members(tmp_path, rng, fmt=fmt)
    X, inactive = read_physical(mem.paths)
    obs = make_obs(X, inactive, rng)
    cfg = load_config(config(tmp_path, write_obs(tmp_path / "obs.nc", obs)))
    before = _sha(mem.paths)
    with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, MPI.COMM_SELF) as ens:
        block = ens.read()
        np.testing.assert_array_equal(block.inactive, inactive)
        act = ~inactive
        np.testing.assert_allclose(block.data[:, act], X[:, act], rtol=1e-6)
        counts = {n: int(inactive[lo:hi].sum()) for n, (lo, hi) in sizes().items()}
        assert ens.stats.inactive == counts
        ens.write(block)
        assert ens.stats.clipped == dict.fromkeys(NAMES, 0)
    assert _sha(mem.paths) == before


def _analyse(cfg: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*ENSIO, "analyse", str(cfg), *extra], capture_output=True, text=True, timeout=300
    )


@needs_nco
@pytest.mark.parametrize("fmt", FORMATS)
def test_analyse_packed_members_with_missing_points(fmt, tmp_path, rng):
    mem = write_members(tmp_path, rng, fmt=fmt)
    X, inactive = read_physical(mem.paths)
    obs = make_obs(X, inactive, rng)
    cfg = config(tmp_path, write_obs(tmp_path / "obs.nc", obs))
    prior = [read_stored(p) for p in mem.paths]
    proc = _analyse(cfg)
    assert proc.returncode == 0, proc.stderr
    check_analysis(mem.paths, prior, X, inactive, obs, proc.stdout)


@needs_nco
def test_local_filter_leaves_inactive_points_and_stays_finite(tmp_path, rng):
    mem = write_members(tmp_path, rng)
    X, inactive = read_physical(mem.paths)
    obs = make_obs(X, inactive, rng)
    cfg = config(tmp_path, write_obs(tmp_path / "obs.nc", obs), filt="letkf")
    prior = [read_stored(p) for p in mem.paths]
    proc = _analyse(cfg)
    assert proc.returncode == 0, proc.stderr
    after, after_inactive = read_physical(mem.paths)
    np.testing.assert_array_equal(after_inactive, inactive)
    assert np.all(np.isfinite(after[:, ~inactive]))
    assert not np.allclose(after[:, ~inactive], X[:, ~inactive])
    for m, path in enumerate(mem.paths):
        stored = read_stored(path)
        for name, (lo, hi) in sizes().items():
            bad = inactive[lo:hi]
            assert stored[name][bad].tobytes() == prior[m][name][bad].tobytes()


def test_unpacked_integer_state_variable_is_refused(tmp_path):
    for m in (1, 2):
        with netCDF4.Dataset(tmp_path / f"mem{m:03d}.nc", "w") as ds:
            ds.createDimension("x", 4)
            ds.createVariable("lon", "f8", ("x",))[:] = np.arange(4.0)
            ds.createVariable("count", "i4", ("x",))[:] = np.arange(4)
    cfg = tmp_path / "ensio.yaml"
    cfg.write_text(
        "ensemble: {members: 'mem{member:03d}.nc', size: 2, variables: [count]}\n"
        "observations: [{file: obs.nc}]\nanalysis: {filter: etkf}\n"
    )
    proc = _analyse(cfg)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "mem001.nc" in lines[0] and "'count'" in lines[0] and "unpacked integer" in lines[0]


def test_unsigned_data_in_a_signed_type_is_refused(tmp_path):
    """``_Unsigned = "true"`` (netCDF-3 bytes holding 0..255): refused, never read with a sign."""
    for m in (1, 2):
        cdl = tmp_path / f"mem{m:03d}.cdl"
        cdl.write_text(
            "netcdf m {\ndimensions: x = 4 ;\nvariables:\n  double lon(x) ;\n"
            '  byte t(x) ;\n    t:_Unsigned = "true" ;\n    t:scale_factor = 0.5 ;\n'
            "data:\n  lon = 0, 1, 2, 3 ;\n  t = 1, 2, -3, -4 ;\n}\n"
        )
        subprocess.run(["ncgen", "-k", "classic", "-o", str(tmp_path / f"mem{m:03d}.nc"),
                        str(cdl)], check=True)  # fmt: skip
    before = {p.name: p.read_bytes() for p in tmp_path.glob("mem*.nc")}
    cfg = tmp_path / "ensio.yaml"
    cfg.write_text(
        "ensemble: {members: 'mem{member:03d}.nc', size: 2, variables: [t]}\n"
        "observations: [{file: obs.nc}]\nanalysis: {filter: etkf}\n"
    )
    proc = _analyse(cfg)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "mem001.nc" in lines[0] and "'t'" in lines[0] and "_Unsigned" in lines[0]
    assert {p.name: p.read_bytes() for p in tmp_path.glob("mem*.nc")} == before
