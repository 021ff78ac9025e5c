"""Vertical localization under mpiexec: the same analysis for any number of ranks.

Rank 0 writes the 3-D case of ``tests/vertical_case.py`` and copies it; the
world communicator analyses one copy (with several ``io.tasks`` and with the
regional distribution of the observations), rank 0 alone (``COMM_SELF``) the
other. Expected: parallel = serial to 1e-12 and both = the independent
point-by-point reference to 1e-10. All collective work happens before any
assertion; rank 0's verdict is broadcast so every rank reports it.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from mpi4py import MPI
from seeds import draw_seed
from vertical_case import make_case, reference_letkf, rel

from ensio.config import config_from_dict
from ensio.offline import run_analysis
from ensio.parallel.agree import root_call

VERTICAL = {"radius": 180.0, "taper": "gaspari-cohn"}


def _twin(case, root):
    """The case's files copied to ``root``, and the config pointing there."""
    shutil.copytree(case.root, root)
    old = str(case.root)
    cfg = case.config(VERTICAL)
    cfg["ensemble"]["members"] = cfg["ensemble"]["members"].replace(old, str(root))
    cfg["observations"] = [{**o, "file": o["file"].replace(old, str(root))}
                           for o in cfg["observations"]]  # fmt: skip
    return cfg


@pytest.mark.parametrize(
    "variant",
    [{"tasks": 1}, {"tasks": 2}, {"tasks": None, "regional": True}],
    ids=["tasks1", "tasks2", "regional"],
)
def test_vertical_analysis_is_the_same_on_any_number_of_ranks(comm, shared_dir, variant):
    label = f"vertical mpi {variant}"
    seed = root_call(comm, lambda: draw_seed(label))
    tag = "-".join(f"{k}{v}" for k, v in variant.items())

    def build():
        case = make_case(shared_dir / f"base-{tag}", np.random.default_rng(seed))
        par = _twin(case, shared_dir / f"par-{tag}")
        ser = _twin(case, shared_dir / f"ser-{tag}")
        if variant["tasks"] is not None:
            par["io"]["tasks"] = min(variant["tasks"], comm.size)
        if variant.get("regional"):
            par["analysis"]["observations"] = {"distribution": "regional"}
        return case, par, ser

    case, par, ser = root_call(comm, build)
    report = run_analysis(config_from_dict(par), comm)

    def serial_and_compare() -> str:
        run_analysis(config_from_dict(ser), MPI.COMM_SELF)
        want = reference_letkf(case, VERTICAL)
        case.root = shared_dir / f"par-{tag}"
        got_par = case.read_state()
        case.root = shared_dir / f"ser-{tag}"
        got_ser = case.read_state()
        if rel(got_par, got_ser) > 1e-12:
            return f"parallel != serial: {rel(got_par, got_ser):.3g}"
        if rel(got_ser, want) > 1e-10:
            return f"serial != reference: {rel(got_ser, want):.3g}"
        return ""

    verdict = root_call(comm, serial_and_compare)
    assert not verdict, verdict
    n_obs = sum(len(o.value) for o in case.obs)
    assert report.result.qc is not None and report.result.qc.accepted == n_obs
