"""The Fortran twin of the stencil model: build it, and its command line.

Why: the output cost that matters is the one a compiled model pays, whose compute
per point is a fraction of numpy's. ``stencil_f/stencil.f90`` is the same 3-D
diffusion as :mod:`ensio.models.stencil` (same initial state, rows per rank, fields,
output steps and float64 numbers) over the C client of the I/O server; the mode comes
from the config's ``ioserver.mode`` (server mode: an MPMD job with ``ensio ioserver``
ranks last), ``none`` runs without output. It is built against ``ensio ioclient
build``'s library (:func:`ensio.ioserver.build.build_client`) on request, never
silently.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..ioserver.build import BuildResult, build_client, run_compiler

__all__ = ["FFLAGS", "build_stencil", "source_dir", "stencil_argv", "read_result"]

#: No FMA contraction and no reassociation: the float64 numbers of the numpy model.
FFLAGS = ("-O2", "-ffp-contract=off", "-Wall")


def source_dir() -> Path:
    """The shipped sources: ``stencil.f90`` and its MPI shim ``stencil_mpi.c``."""
    return Path(__file__).resolve().parent / "stencil_f"


def build_stencil(prefix: str | Path, client: BuildResult | None = None) -> Path:
    """Build the client into ``prefix`` (unless ``client`` is given) and the model as
    ``prefix/bin/ensio-stencil-f``; the executable's path.

    Raises
    ------
    BuildError
        A compiler is missing or fails (one line).
    """
    prefix = Path(prefix).resolve()
    r = client if client is not None else build_client(prefix)
    src = source_dir()
    work = prefix / "build" / "stencil"
    work.mkdir(parents=True, exist_ok=True)
    exe = prefix / "bin" / "ensio-stencil-f"
    exe.parent.mkdir(parents=True, exist_ok=True)
    run_compiler([str(r.mpicc), "-O2", "-Wall", "-c", str(src / "stencil_mpi.c"), "-o",
                  "stencil_mpi.o"], work, "stencil build")
    # the Fortran compiler's own objects: no MPI module needed (the shim does MPI)
    run_compiler([str(r.fc), *FFLAGS, str(src / "stencil.f90"), "stencil_mpi.o", "-o", str(exe),
                  *r.fortran_flags.split()], work, "stencil build")
    return exe


def stencil_argv(exe: str | Path, config: str | Path | None, *, nx: int, ny: int, nz: int,
                 fields: int, steps: int, sweeps: int, json_path: str | Path) -> list[str]:
    """The model's command line (``config=None``: no output)."""
    return [str(exe), "none" if config is None else str(config), str(nx), str(ny), str(nz),
            str(fields), str(steps), str(sweeps), str(json_path)]


def read_result(json_path: str | Path, mode: str) -> dict[str, Any]:
    """The model's JSON (rank 0) with ``mode``: the keys of ``RunResult`` (ensio.models.stencil)."""
    res = json.loads(Path(json_path).read_text())
    res["mode"] = mode
    return res
