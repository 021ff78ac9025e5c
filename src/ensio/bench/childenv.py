"""The environment of the programs a benchmark starts.

Why: a benchmark's child processes (``mpiexec`` jobs, producers and
consumers) must import the same ``ensio`` as the driver, also from a source
checkout that is not installed, and must not start BLAS threads of their own
(each child is one rank of a measured layout).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["child_env"]


def child_env(drop_preload: bool = False) -> dict[str, str]:
    """``os.environ`` with this ``ensio`` first on ``PYTHONPATH`` and one OpenMP thread.

    ``drop_preload`` removes ``LD_PRELOAD`` (a driver itself run under an
    interposer must not hand it to the cases it measures).
    """
    env = {k: v for k, v in os.environ.items() if not (drop_preload and k == "LD_PRELOAD")}
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env
