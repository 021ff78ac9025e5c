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
- the Lorenz-96 example (``python -m ensio.online.l96``) gives the analyses
  of the same cycles run offline (``l96case run`` + ``run_analysis``).

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

import netCDF4
import numpy as np
import pytest
import yaml
from cases import reference_matrix
from mpi4py import MPI
from online_child import CYCLE, VARS, config_dict, make_case

from ensio.config import config_from_dict
from ensio.models import l96case
from ensio.offline import run_analysis
from ensio.online.l96 import cycle_config

pytestmark = pytest.mark.mpi

HERE = Path(__file__).parent
CHILD = HERE / "online_child.py"
MPIEXEC = Path(sys.executable).parent / "mpiexec"
#: Hang guard of a failing job (they end in seconds; 'stuck' after its 8 s timeout).
ERROR_GUARD = 60.0


def _spawn(n: int, args: list[str], guard: float) -> subprocess.CompletedProcess:
    """Run ``mpiexec -n n python ARGS``; kill its whole process group if ``guard`` expires."""
    if not MPIEXEC.exists():
        pytest.skip(f"no mpiexec next to {sys.executable}")
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


L96_CONFIG = {
    "ensemble": {"members": "unused/mem{member:03d}.nc", "size": 4, "variables": ["x"]},
    "analysis": {
        "filter": "letkf",
        "localization": {"taper": "gaspari-cohn", "radius": 10.0, "periodic": 40},
        "inflation": {"forget": 0.95},
    },
}


def _l96_offline(config, workdir: Path, cycles: int, steps: int) -> None:
    """The offline cycle by hand: member forecasts by the l96case program, then ensio analyse."""
    l96case.setup(workdir, config.ensemble.size, cycles, seed=3, steps=steps)
    for c in range(1, cycles + 1):
        cfg = cycle_config(config, workdir, c)
        for m, out in enumerate(cfg.member_paths(), start=1):
            init = (
                workdir / "init" / f"mem{m:03d}.nc"
                if c == 1
                else workdir / f"cycle_{c - 1:03d}" / "analysis" / f"mem{m:03d}.nc"
            )
            l96case.run(init, out, steps)
        run_analysis(cfg, MPI.COMM_SELF, cycle=c)


@pytest.mark.parametrize("p", [1, 2])
def test_lorenz96_online_equals_offline(p, tmp_path):
    cfg_path = tmp_path / "l96.yaml"
    cfg_path.write_text(yaml.safe_dump(L96_CONFIG))
    config = config_from_dict(L96_CONFIG, base_dir=tmp_path)
    cycles, steps = 2, 2
    _l96_offline(config, tmp_path / "offline", cycles, steps)
    args = ["-m", "ensio.online.l96", str(cfg_path), "--workdir", str(tmp_path / "online")]
    args += ["--cycles", str(cycles), "--tasks-per-member", str(p), "--seed", "3"]
    args += ["--steps", str(steps)]
    res = _spawn(4 * p, args, guard=600.0)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "cycle 2: prior rms" in res.stdout
    for c in range(1, cycles + 1):
        for kind in ("forecast", "analysis"):
            for m in range(1, 5):
                rel = Path(f"cycle_{c:03d}") / kind / f"mem{m:03d}.nc"
                x_on, t_on = l96case.read_state(tmp_path / "online" / rel)
                x_off, t_off = l96case.read_state(tmp_path / "offline" / rel)
                assert t_on == t_off, rel
                # relative to the field's scale, as everywhere (DESIGN.md: ≤ 1e-12 relative)
                assert np.max(np.abs(x_on - x_off)) <= 1e-12 * np.max(np.abs(x_off)), rel
    on = l96case.rmse_table(tmp_path / "online")
    off = l96case.rmse_table(tmp_path / "offline")
    assert len(on) == cycles
    np.testing.assert_allclose(np.array(on, dtype=float), np.array(off, dtype=float), rtol=1e-11)
