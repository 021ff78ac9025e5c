"""The synthetic-field "model" of the seed paper as a member task.

``ensio model synthrun --init IN --out OUT [--sleep S] [--shift D]`` (parsed
in :mod:`ensio.cli.model`) reads a member file of ``ensio synth``, optionally
sleeps (to imitate the cost of a real forecast), advects the field eastward by
``D`` grid points (a trivial but real dynamics, so cycles differ) and writes
OUT atomically (a temporary name, then rename): the whole file is copied, so
every auxiliary variable and attribute is carried forward.

With ``--ioserver IODEF`` (under ``mpiexec -n P+S``, :func:`run_ioserver`)
the same forecast runs on P model ranks, each owning a block of latitude
rows (:class:`~ensio.parallel.distribution.RowDistribution`): a rank reads
its rows, advects them (the shift along longitude is row-local), hands them
to the dedicated restart writers with
:meth:`~ensio.ioserver.client.Client.write_restart` and goes on with the rest
of its forecast (``--sleep``) while a server assembles and writes the file
(seed 003). Several ``--init``/``--out`` pairs (members) can share one run.
The files equal the serial path's.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import netCDF4
import numpy as np

from ..durable import replacing

__all__ = ["run", "run_ioserver"]


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



def run_ioserver(world, iodef: Path, pairs: list[tuple[Path, Path]], sleep: float = 0.0,
                 shift: int = 0, variable: str = "state") -> object | None:
    """The forecasts of ``pairs`` (init, out) with restarts written by the I/O server.

    Collective over ``world``; returns the model ranks' report (``None`` on
    server ranks). The restart of each member is sent as soon as its state is
    ready; the model's remaining work (``sleep``) overlaps the writing, and
    ``close()`` waits for the files.
    """
    from ..ioserver import start
    from ..parallel.distribution import RowDistribution

    client = start(world, iodef, context="synthrun")
    if client is None:
        return None
    with client:
        for init, out in pairs:
            with netCDF4.Dataset(init) as ds:
                v = ds[variable]
                v.set_auto_maskandscale(False)
                rows = RowDistribution.of(v.shape[-2], client.comm)
                block = np.asarray(v[..., rows.start:rows.stop, :])
            if shift:
                block = np.roll(block, shift, axis=-1)
            start_ = (0,) * (block.ndim - 2) + (rows.start, 0)
            client.write_restart(out, {variable: (start_, block)}, template=init)
        if sleep > 0:
            time.sleep(sleep)  # the rest of the forecast, overlapping the writes
        return client.close()
