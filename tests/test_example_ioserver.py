"""``examples/ioserver``: the example model runs with its iodef, and its weekly file is right.

The weekly ``ave_daily_max`` (the seed's "monthly mean of daily maxima", on a
week) and ``min_daily_ave`` are recomputed here from the ``tas`` formula of the
example, independently of the server's time operations.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import needs
import netCDF4
import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ioserver"
NI, NJ = 36, 18

pytestmark = pytest.mark.mpi


def _tas(step: int) -> np.ndarray:
    lon = np.deg2rad((np.arange(NI) + 0.5) * 360.0 / NI)
    lat = np.deg2rad(-90.0 + (np.arange(NJ) + 0.5) * 180.0 / NJ)
    phase = 2.0 * np.pi * step / 24.0
    return 273.0 + 30.0 * np.cos(lat)[:, None] + 5.0 * np.cos(lon[None, :] - phase)


def test_the_example_model_writes_the_weekly_statistics_of_its_field(tmp_path: Path) -> None:
    mpiexec = needs.mpiexec()
    work = tmp_path / "ioserver"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("output"))
    res = subprocess.run([str(mpiexec), "-n", "3", sys.executable, "model.py", "--days", "7"],
                         cwd=work, capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout + res.stderr
    files = sorted(p.name for p in (work / "output").glob("*.nc"))
    assert files == ["atm_1d.nc", *[f"atm_1h_200001{d:02d}.nc" for d in range(1, 8)],
                     "atm_7d.nc"]
    days = np.array([[_tas(s) for s in range(24 * d + 1, 24 * d + 25)] for d in range(7)])
    with netCDF4.Dataset(work / "output" / "atm_7d.nc") as ds:
        got_max = ds["ave_daily_max"][0]
        got_min = ds["min_daily_ave"][0]
        assert ds["time_bnds"][0].tolist() == [0.0, 7 * 86400.0]
    np.testing.assert_allclose(got_max, days.max(axis=1).mean(axis=0), rtol=2e-7)
    np.testing.assert_allclose(got_min, days.mean(axis=1).min(axis=0), rtol=2e-7)
