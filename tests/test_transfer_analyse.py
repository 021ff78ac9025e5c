"""``ensio analyse`` under the interposer: members arrive in memory, the analysis is written
back in place into memory, and the next component reads it: bitwise the file-based run.

The members' path belongs to two connections (forecasts: model → analysis, analyses:
analysis → model), so the analysis both reads and writes them; ``cp`` is the model.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys

import netCDF4
import numpy as np
import pytest
from transfer_support import (  # noqa: F401  (the *_fixture names are fixtures)
    SRC,
    Host,
    host_fixture,
    interposer_cache_fixture,
)

NE = 4

SUMS = r"""
import hashlib, sys
for p in sys.argv[1:]:
    with open(p, "rb") as f:
        print(p, hashlib.sha256(f.read()).hexdigest())
"""


@pytest.fixture
def cases(host: Host):
    w = host.work
    env = dict(host.env, PYTHONPATH=str(SRC))
    subprocess.run([sys.executable, "-m", "ensio", "synth", "ref", "--nx", "24", "--ny", "12",
                    "--members", str(NE), "--seed", "5"], cwd=w, env=env, check=True,
                   capture_output=True)
    (w / "tr").mkdir()
    (w / "forecast").mkdir()
    for f in (w / "ref").iterdir():
        if f.name.startswith("mem"):
            shutil.copy(f, w / "forecast" / f.name)
        elif f.is_file():
            shutil.copy(f, w / "tr" / f.name)
    (w / "t.yaml").write_text(
        "components: [model, analysis]\nconnections:\n"
        "  - {name: forecasts, from: model, to: analysis, files: ['tr/mem*.nc']}\n"
        "  - {name: analyses, from: analysis, to: model, files: ['tr/mem*.nc']}\n")
    return host, w / "t.yaml"


def test_ensio_analyse_reads_and_writes_members_in_memory(cases):
    host, config = cases
    w = host.work
    for k in range(1, NE + 1):  # the "model" hands its forecasts over
        p = host.run(config, "model", "cp", f"forecast/mem{k:03d}.nc", f"tr/mem{k:03d}.nc")
        assert p.returncode == 0, p.stderr
    ref = subprocess.run([sys.executable, "-m", "ensio", "analyse", "ref/ensio.yaml"], cwd=w,
                         env=host.env, capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    p = host.run(config, "analysis", sys.executable, "-m", "ensio", "analyse", "tr/ensio.yaml",
                 timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[:3] == ref.stdout.splitlines()[:3]  # the same statistics
    assert not list((w / "tr").glob("mem*"))  # members never touched the disk
    held = {s.path: (s.state, s.component, s.connection) for s in host.status()}
    assert held == {str((w / "tr" / f"mem{k:03d}.nc").resolve()):
                    ("complete", "analysis", "analyses") for k in range(1, NE + 1)}
    names = [f"tr/mem{k:03d}.nc" for k in range(1, NE + 1)]
    sums = host.run(config, "model", sys.executable, "-c", SUMS, *names)
    assert sums.returncode == 0, sums.stderr
    for line, k in zip(sums.stdout.splitlines(), range(1, NE + 1), strict=True):
        want = hashlib.sha256((w / "ref" / f"mem{k:03d}.nc").read_bytes()).hexdigest()
        assert line == f"tr/mem{k:03d}.nc {want}"
    # the analysis did change the members (an independent look at the reference files)
    with netCDF4.Dataset(w / "ref" / "mem001.nc") as a, \
            netCDF4.Dataset(w / "forecast" / "mem001.nc") as f:
        assert not np.array_equal(a["state"][:], f["state"][:])
    for product in ("mean", "spread"):
        with netCDF4.Dataset(w / "tr" / "an" / f"{product}.nc") as t, \
                netCDF4.Dataset(w / "ref" / "an" / f"{product}.nc") as r:
            np.testing.assert_array_equal(t["state"][:], r["state"][:])
