"""The diagnostics file does not depend on the number of ranks (issue 26 item 3).

Rank 0 writes the members and observations of tests/test_obsdiag.py's case
and copies them; the world communicator analyses one copy, rank 0 alone
(``COMM_SELF``) the other. Every collective step happens before any
assertion; rank 0's verdict is broadcast so every rank reports it.
"""

from __future__ import annotations

import copy
import shutil

import netCDF4
import numpy as np
import pytest
from mpi4py import MPI
from test_obsdiag import _case

from ensio.config import config_from_dict
from ensio.offline import run_analysis

#: H(x^b) reads the prior as stored, so everything of the prior is bitwise equal;
#: the analysis rows agree to rounding (DESIGN.md: ≤ 1e-12 relative).
POSTERIOR = ("oma", "spread_a", "oma_mean", "oma_rms", "spread_a_rms")


def _contents(path) -> dict[str, np.ndarray]:
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_mask(False)  # NaN stays NaN; level_index keeps its -1
        out = {n: np.asarray(v[:]) for n, v in ds.variables.items()}
        out["attrs"] = np.array(sorted(f"{a}={ds.getncattr(a)}" for a in ds.ncattrs()))
    return out


def _verdict(par, ser) -> str:
    a, b = _contents(par), _contents(ser)
    if sorted(a) != sorted(b):
        return f"variables differ: {sorted(a)} vs {sorted(b)}"
    for name in a:
        x, y = a[name], b[name]
        if x.shape != y.shape:
            return f"{name}: shape {x.shape} vs {y.shape}"
        if name in POSTERIOR:
            bad = ~np.isclose(x, y, rtol=1e-12, atol=1e-12, equal_nan=True)
        elif x.dtype.kind == "f":
            bad = ~((x == y) | (np.isnan(x) & np.isnan(y)))
        else:
            bad = x != y
        if np.any(bad):
            return f"{name}: {int(bad.sum())} entries differ between the parallel and serial run"
    return ""


@pytest.mark.parametrize("name", ["letkf", "etkf"])
def test_diag_file_is_the_same_for_any_number_of_ranks(comm, shared_dir, name):
    root = shared_dir / name
    raw = None
    if comm.rank == 0:
        _, _, _, raw = _case(root / "par")
        raw["analysis"]["filter"] = name
        if name == "etkf":
            del raw["analysis"]["localization"]
        shutil.copytree(root / "par", root / "ser")
    raw = comm.bcast(raw, root=0)
    cfgs = {}
    for which in ("par", "ser"):
        r = copy.deepcopy(raw)
        r["ensemble"]["members"] = str(root / which / "mem{member:03d}.nc")
        r["output"] = {"diagnostics": "diag_{cycle}.nc"}
        cfgs[which] = config_from_dict(r, base_dir=root / which)
    run_analysis(cfgs["par"], comm, cycle=4)
    verdict = ""
    if comm.rank == 0:
        run_analysis(cfgs["ser"], MPI.COMM_SELF, cycle=4)
        verdict = _verdict(root / "par" / "diag_4.nc", root / "ser" / "diag_4.nc")
    verdict = comm.bcast(verdict, root=0)
    assert verdict == "", verdict
