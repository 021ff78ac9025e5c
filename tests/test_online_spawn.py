"""The online mode in real coupled jobs: ``mpiexec -n N_e*P`` children (issue 5 acceptance).

- online == offline (≤ 1e-12 relative) for N_e ∈ {4, 8} × P ∈ {1, 2}: the
  child (tests/online_child.py) couples N_e members of P ranks each; the
  reference is :func:`ensio.offline.run_analysis` on the same files, here,
  serially (its result does not depend on the number of ranks);
- a wrong block size, a member that raises, a member that hangs, a member
  that calls ``sys.exit``, a filter rank that fails alone, a bad observation
  file: every job ends with a
  non-zero status and a message naming the problem, well within the hang
  guard of :func:`_spawn` (the children are killed if it expires);
(The shipped Lorenz-96 example run both ways through ``ensio cycle --mode
online|offline`` is compared in tests/test_cycle.py.)

On 2 cores 16 ranks are oversubscribed (MPICH's hydra allows it); the cases
are tiny (N_x = 231, 40 observations), so a job takes seconds.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import needs
import netCDF4
import numpy as np
import pytest
import yaml
from cases import reference_matrix
from mpi4py import MPI
from online_child import CYCLE, VARS, config_dict, make_case

from ensio.config import config_from_dict
from ensio.offline import run_analysis

pytestmark = pytest.mark.mpi

HERE = Path(__file__).parent
CHILD = HERE / "online_child.py"
MPIEXEC = Path(sys.executable).parent / "mpiexec"
#: Hang guard of a failing job (they end in seconds; 'stuck' after its 8 s timeout).
ERROR_GUARD = 60.0


def _spawn(n: int, args: list[str], guard: float) -> subprocess.CompletedProcess:
    """Run ``mpiexec -n n python ARGS``; kill its whole process group if ``guard`` expires."""
    needs.mpiexec()  # MPIEXEC
    cmd = [str(MPIEXEC), "-n", str(n), sys.executable, *args]
    env = {**os.environ, "PYTHONPATH": str(HERE), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=guard)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} still running after {guard} s (hang)\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _prepare(root: Path, members: int, filter_: str = "letkf") -> None:
    make_case(root, members)
    for out in ("online", "offline"):
        raw = config_dict(root, members, out, filter_)
        (root / f"{out}.yaml").write_text(yaml.safe_dump(raw))


@pytest.mark.parametrize(
    ("n_e", "p", "filter_"),
    [(4, 1, "letkf"), (4, 2, "lestkf"), (8, 1, "enkf"), (8, 2, "letkf")],
)
def test_online_equals_offline(n_e, p, filter_, tmp_path):
    _prepare(tmp_path, n_e, filter_)
    raw = yaml.safe_load((tmp_path / "offline.yaml").read_text())
    off = run_analysis(config_from_dict(raw, base_dir=tmp_path), MPI.COMM_SELF, cycle=CYCLE)
    assert off.result.qc.accepted > 0
    res = _spawn(n_e * p, [str(CHILD), str(tmp_path), str(p), "ok"], guard=600.0)
    assert res.returncode == 0, res.stderr[-3000:]
    members = range(1, n_e + 1)
    want = reference_matrix([tmp_path / f"offline/mem{m:03d}.nc" for m in members], VARS)
    got = reference_matrix([tmp_path / f"online/mem{m:03d}.nc" for m in members], VARS)
    scale = np.max(np.abs(want))
    assert np.max(np.abs(got - want)) <= 1e-12 * scale
    blocks = np.stack(
        [
            np.concatenate([np.load(tmp_path / f"blocks/mem{m:03d}_p{q}.npy") for q in range(p)])
            for m in members
        ]
    )
    assert np.max(np.abs(blocks - want)) <= 1e-12 * scale
    with netCDF4.Dataset(tmp_path / "online/mean.nc") as a:
        with netCDF4.Dataset(tmp_path / "offline/mean.nc") as b:
            for v in VARS:
                np.testing.assert_allclose(a[v.name][:], b[v.name][:], rtol=1e-12)


@pytest.mark.parametrize(
    ("mode", "n_e", "p", "expect"),
    [
        (
            "wrong-size",
            4,
            1,
            r"member 4 model rank 0 passed a block of shape \(230,\), expected \(231,\)",
        ),
        (
            "raise",
            4,
            1,
            r"ensio online: member 2 \(world rank 1\) failed: RuntimeError: "
            "the model of this member blew up",
        ),
        # both ranks of member 2 raise; the first to abort reports
        ("raise", 2, 2, r"ensio online: member 2 \(world rank [23]\) failed: RuntimeError"),
        ("stuck", 2, 1, "assimilate of cycle 3 did not finish"),
        (
            "filter-crash",
            2,
            2,
            r"ensio online: filter rank 0 \(member 1\) \(world rank 0\) failed: "
            "FloatingPointError: simulated failure inside the analysis",
        ),
        ("bad-obs", 2, 1, "no-such-obs.nc: observation file not found"),
        ("exit", 2, 1, r"ensio online: member 2 \(world rank 1\) exited early"),
    ],
)
def test_failures_end_the_job_with_a_message(mode, n_e, p, expect, tmp_path):
    _prepare(tmp_path, n_e)
    res = _spawn(n_e * p, [str(CHILD), str(tmp_path), str(p), mode], guard=ERROR_GUARD)
    assert res.returncode != 0
    assert re.search(expect, res.stderr), res.stderr[-3000:]
    assert not (tmp_path / "online").exists() or not any((tmp_path / "online").glob("mem*.nc"))
