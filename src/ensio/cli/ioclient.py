"""``ensio ioclient build``: compile the C client library and Fortran module.

A C or Fortran model links ``libensio_ioclient`` to send its fields to the Python
server ranks of ``ensio ioserver`` in the same MPMD job (or, in attached/sync mode, to
the Python client it runs in the model process); it must be built with the MPI the job
runs on: ``--mpicc``/``--mpifort``, else ``$MPICC``/``$MPIFC``, else the venv's ``mpicc``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_parser", "run_build"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``ioclient`` sub-command (with its ``build`` action)."""
    p = subparsers.add_parser(
        "ioclient",
        help="build the C/Fortran client of the I/O server",
        description="C and Fortran clients of the ensio I/O server (ensio ioserver).",
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    b = sub.add_parser(
        "build",
        help="compile libensio_ioclient and the Fortran module into a prefix",
        description=(
            "Compile the shipped sources into PREFIX/lib/libensio_ioclient.{so,a}, "
            "PREFIX/lib/libensio_ioclient_py.so (attached/sync modes, read_restart), "
            "PREFIX/include/ensio_ioclient.h and PREFIX/include/ensio_ioclient.mod, "
            "with the compiler wrappers of the MPI the job runs on (default: $MPICC and "
            "$MPIFC, else the mpicc of this Python environment and gfortran)."
        ),
    )
    b.add_argument("--prefix", type=Path, required=True, metavar="DIR",
                   help="installation prefix (lib/ and include/ are created)")
    b.add_argument("--mpicc", metavar="PATH",
                   help="MPI C compiler wrapper (default: $MPICC, else mpicc next to this "
                        "Python)")
    b.add_argument("--mpifort", metavar="PATH",
                   help="MPI Fortran wrapper (default: $MPIFC); a model built with it may "
                        "`use mpi` / `use mpi_f08`")
    b.add_argument("--fc", metavar="PATH",
                   help="plain Fortran compiler when there is no --mpifort (default: "
                        "gfortran)")
    b.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> int:
    """Build, then print what was installed and how to compile a model against it."""
    from ..ioserver.build import build_client

    r = build_client(args.prefix, mpicc=args.mpicc, fc=args.fc, mpifort=args.mpifort)
    extra = f", {r.python_lib}" if r.python_lib else ""
    print(f"built {r.shared_lib}, {r.static_lib}{extra}, {r.header}, {r.module}")
    print(f"C:       {r.mpicc} model.c {r.c_flags}")
    print(f"Fortran: {r.fc} model.f90 {r.fortran_flags}")
    from ..ioserver.build import xios_flags  # module xios: an XIOS model relinked

    print(f"XIOS:    {r.fc} model.f90 {xios_flags(r)}")
    return 0
