"""The real-file analysis under mpiexec equals the serial one and the independent reference.

Rank 0 builds the members with CDO/NCO (tests/realfiles.py: formats, chunking
and deflation differ per member, so both the raw byte-range path and the
library path run) and copies them; the world communicator analyses one copy
in place, rank 0 alone (``COMM_SELF``) the other. All collective work happens
before any assertion; rank 0's verdict is broadcast so every rank reports it.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import realfiles as rf
from mpi4py import MPI
from test_real_files import analysed, expected_analysis, raw, rel, state_rows

from ensio.config import config_from_dict
from ensio.offline import run_analysis


def _retarget(s: rf.Scenario, root: Path) -> rf.Scenario:
    """The same scenario with its members (and outputs) under ``root``."""
    shutil.copytree(s.root, root)
    t = copy.deepcopy(s)
    t.root, t.paths = root, [root / p.name for p in s.paths]
    old = str(s.root)
    ens = t.config["ensemble"]
    ens["members"] = ens["members"].replace(old, str(root))
    t.config["output"] = {k: v.replace(old, str(root)) for k, v in t.config["output"].items()}
    return t


def _verdict(par: rf.Scenario, ser: rf.Scenario) -> str:
    """Empty if the parallel files equal the serial ones and both match the reference."""
    rows = state_rows(par)
    want, _ = expected_analysis(par, rows)
    got_par = state_rows(par, analysed(par)).X
    got_ser = state_rows(ser, analysed(ser)).X
    if rel(got_par, got_ser) > 1e-12:
        return f"parallel != serial: {rel(got_par, got_ser):.3g}"
    if rel(got_par, want) > 1e-10:
        return f"parallel != reference: {rel(got_par, want):.3g}"
    for p, q in zip(par.paths, ser.paths, strict=True):
        a, b = raw(p), raw(q)
        for name in a:
            if name not in par.state and a[name].tobytes() != b[name].tobytes():
                return f"{p.name}:{name} differs between the parallel and the serial run"
    return ""


def _on_root(comm: MPI.Comm, fn):
    """``fn()`` on rank 0, its result (or its error, re-raised) on every rank: no rank hangs."""
    out = None
    if comm.rank == 0:
        try:
            out = (fn(), None)
        except Exception as exc:  # noqa: BLE001 - handed to every rank
            out = (None, f"rank 0: {type(exc).__name__}: {exc}")
    value, error = comm.bcast(out, root=0)
    assert error is None, error
    return value


def test_real_files_same_analysis_in_parallel_and_serially(comm, shared_dir):
    def build():
        par = rf.chunked(shared_dir / "par", 21)
        par.config["io"]["tasks"] = min(2, comm.size)
        ser = _retarget(par, shared_dir / "ser")
        ser.config["io"]["tasks"] = 1
        return par, ser

    par, ser = _on_root(comm, build)
    report = run_analysis(config_from_dict(par.config, base_dir=par.root), comm)

    def serial_and_compare():
        run_analysis(config_from_dict(ser.config, base_dir=ser.root), MPI.COMM_SELF)
        return _verdict(par, ser)

    verdict = _on_root(comm, serial_and_compare)
    assert not verdict, verdict
    assert report.result.qc is not None and report.result.qc.accepted == 30
