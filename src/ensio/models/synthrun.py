"""The synthetic-field "model" of the seed paper as a member task.

``python -m ensio.models.synthrun --init IN --out OUT [--sleep S] [--shift D]``
reads a member file of ``ensio synth``, optionally sleeps (to imitate the
cost of a real forecast), advects the field eastward by ``D`` grid points (a
trivial but real dynamics, so cycles differ) and writes OUT atomically (a
temporary name, then rename): the whole file is copied, so every auxiliary
variable and attribute is carried forward.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import netCDF4
import numpy as np

from ..durable import replacing

__all__ = ["main", "run"]


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ensio.models.synthrun", description=__doc__)
    p.add_argument("--init", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--shift", type=int, default=0)
    p.add_argument("--variable", default="state")
    a = p.parse_args(argv)
    run(a.init, a.out, a.sleep, a.shift, a.variable)
    return 0


if __name__ == "__main__":
    sys.exit(main())
