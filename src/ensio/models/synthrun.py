"""The synthetic-field "model" of the seed paper as a member task.

``ensio model synthrun --init IN --out OUT [--sleep S] [--shift D]`` (parsed
in :mod:`ensio.cli.model`) reads a member file of ``ensio synth``, optionally
sleeps (to imitate the cost of a real forecast), advects the field eastward by
``D`` grid points (a trivial but real dynamics, so cycles differ) and writes
OUT atomically (a temporary name, then rename): the whole file is copied, so
every auxiliary variable and attribute is carried forward.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import netCDF4
import numpy as np

from ..durable import replacing

__all__ = ["run"]


def run(init: Path, out: Path, sleep: float = 0.0, shift: int = 0, variable: str = "state") -> None:
    """One forecast: copy, shift ``variable`` along its last (longitude) axis, rename into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with replacing(out) as tmp:
        shutil.copyfile(init, tmp)
        if sleep > 0:
            time.sleep(sleep)  # imitates a longer model run
        if shift:
            with netCDF4.Dataset(tmp, "a") as ds:
                v = ds[variable]
                v.set_auto_maskandscale(False)
                v[...] = np.roll(np.asarray(v[...]), shift, axis=-1)

