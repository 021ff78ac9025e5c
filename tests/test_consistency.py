"""Member consistency (issue 10 item 4): same coordinates in every member, distinct files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import yaml
from test_obs_operator import cdo_member, cfg_dict, needs_cdo

from ensio.config import config_from_dict
from ensio.errors import InputError
from ensio.io.scan.consistency import REL_TOL
from ensio.io.scan.members import MemberScan, layout_from_member

ENSIO = [sys.executable, "-m", "ensio"]
N = 4


@pytest.fixture
def members(tmp_path) -> list[Path]:
    return [cdo_member(tmp_path, m) for m in range(1, N + 1)]


def analyse(root: Path) -> subprocess.CompletedProcess:
    obs = root / "obs.nc"
    with netCDF4.Dataset(obs, "w") as ds:
        ds.createDimension("obs", 1)
        for k, v in {"lon": 10.0, "lat": 5.0, "value": 0.5, "error": 0.1}.items():
            ds.createVariable(k, "f8", ("obs",))[:] = [v]
    raw = cfg_dict(root, N)
    raw["observations"] = ["obs.nc"]
    raw["analysis"] = {"filter": "etkf"}
    (root / "ensio.yaml").write_text(yaml.safe_dump(raw))
    before = {p: p.read_bytes() for p in root.glob("mem*.nc")}
    r = subprocess.run([*ENSIO, "analyse", str(root / "ensio.yaml")], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    if r.returncode != 0:
        assert {p: p.read_bytes() for p in root.glob("mem*.nc")} == before
    return r


def one_line(r) -> str:
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    return r.stderr


@needs_cdo
def test_inverted_latitude_member_is_named(tmp_path, members):
    for m in (3, 2):  # members 2 and 3 are inverted: the first (2) is named
        subprocess.run(["cdo", "-s", "invertlat", members[m - 1], tmp_path / "x.nc"], check=True)
        os.replace(tmp_path / "x.nc", members[m - 1])
    err = one_line(analyse(tmp_path))
    assert "mem002.nc" in err and "'lat'" in err and "mem001.nc" in err


@needs_cdo
def test_symlink_and_hard_link_duplicates_name_both(tmp_path, members):
    members[2].unlink()
    members[2].symlink_to(members[0].name)
    err = one_line(analyse(tmp_path))
    assert "mem001.nc" in err and "mem003.nc" in err and "same file" in err
    members[2].unlink()
    os.link(members[1], members[2])
    err = one_line(analyse(tmp_path))
    assert "mem002.nc" in err and "mem003.nc" in err and "same file" in err


@needs_cdo
def test_tolerance_and_time(tmp_path, members):
    from mpi4py import MPI

    cfg = config_from_dict(cfg_dict(tmp_path, N))
    layout = layout_from_member(cfg.ensemble, members[0])
    with netCDF4.Dataset(members[1], "a") as ds:  # within the tolerance: accepted
        lon = ds["lon"][:]
        ds["lon"][:] = lon + 0.5 * REL_TOL * np.maximum(1.0, np.abs(lon))
    MemberScan(members, layout, MPI.COMM_SELF)
    with netCDF4.Dataset(members[1], "a") as ds:  # beyond: refused, naming element and value
        ds["lon"][5] = lon[5] + 3 * REL_TOL * max(1.0, abs(lon[5]))
    with pytest.raises(InputError, match=r"mem002\.nc: coordinate 'lon' differs .* at \(5,\)"):
        MemberScan(members, layout, MPI.COMM_SELF)
    with netCDF4.Dataset(members[1], "a") as ds:
        ds["lon"][:] = lon
        ds["plev"][1] = 84999.0
    with pytest.raises(InputError, match=r"mem002\.nc: coordinate 'plev'"):
        MemberScan(members, layout, MPI.COMM_SELF)
    with netCDF4.Dataset(members[1], "a") as ds:
        ds["plev"][1] = 85000.0
    with netCDF4.Dataset(members[3], "a") as ds:  # time: exactly equal
        ds["time"][0] = ds["time"][0] + 1e-9
    with pytest.raises(InputError, match=r"mem004\.nc: coordinate 'time'.*must be equal"):
        MemberScan(members, layout, MPI.COMM_SELF)
