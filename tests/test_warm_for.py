"""``warm_for``: what an analysis started ahead loads before its go.

In a fresh process the configured analysis must find every numba kernel it
calls already loaded after ``warm_for`` (no dispatcher compiles or loads one
during the run); without it, the same run does load some, so the count can fail.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ensio.cli.synth import main as synth_main

SCRIPT = r"""
import sys
from mpi4py import MPI
from numba.core import dispatcher
from ensio.analysis.warm import warm_for
from ensio.config.load import load_config
from ensio.offline import run_analysis

cfg = load_config(sys.argv[1], sys.argv[3:])
if sys.argv[2] == "warm":
    warm_for(cfg.analysis, cfg.ensemble.size)
loads = []
original = dispatcher.Dispatcher._compile_for_args
def counted(self, *args, **kw):
    loads.append(self.py_func.__name__)
    return original(self, *args, **kw)
dispatcher.Dispatcher._compile_for_args = counted
run_analysis(cfg, MPI.COMM_SELF, cycle=1)
print("LOADS", len(loads), ",".join(sorted(set(loads))))
"""


SETS = ["analysis.localization.vertical={taper: gaspari-cohn, radius: 1.5}",
        "ensemble.variables=[state, aux]"]


def test_warm_for_loads_every_kernel_the_analysis_calls(tmp_path: Path) -> None:
    """Vertical localization and two variables: one row and several rows per point."""
    sets = SETS
    counts = {}
    for mode in ("cold", "warm"):
        case = tmp_path / mode
        assert synth_main([str(case), "--nx", "12", "--ny", "6", "--members", "5", "--seed", "2",
                           "--levels", "2", "--perturbation", "1.0"]) == 0
        out = subprocess.run([sys.executable, "-c", SCRIPT, str(case / "ensio.yaml"), mode,
                              *sets], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        line = next(x for x in out.stdout.splitlines() if x.startswith("LOADS"))
        counts[mode] = line
    assert not counts["cold"].startswith("LOADS 0"), counts  # the count can fail
    assert counts["warm"].startswith("LOADS 0 "), counts
