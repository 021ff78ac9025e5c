"""Build XIOS's Fortran interface (module ``xios``) over the installed C client.

``ensio ioclient build --prefix DIR`` calls this after the client itself, so an
XIOS model finds what its build expects under XIOS's names::

    DIR/include/xios.mod      DIR/lib/libxios.so      DIR/lib/libxios.a

and relinks with ``-I DIR/include -L DIR/lib -lxios -lensio_ioclient`` (plus MPI)
instead of XIOS's ``-lxios -lstdc++``. The module (``csrc/xios.f90``) calls the C
client through ``iso_c_binding``; it needs no Fortran MPI bindings either.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .build import BuildError, BuildResult, _install, _run, csrc_dir

__all__ = ["build_xios", "xios_flags"]

_FFLAGS = ("-O2", "-fPIC", "-Wall")


def build_xios(result: BuildResult) -> tuple[Path, Path, Path]:
    """Compile ``xios.f90`` with the client's Fortran compiler into ``result.prefix``.

    Returns ``(libxios.so, libxios.a, xios.mod)``; a compiler failure is a
    :class:`~.build.BuildError` (one line).
    """
    lib = result.shared_lib.parent
    inc = result.header.parent
    with tempfile.TemporaryDirectory(prefix="ensio-xios-") as tmp:
        work = Path(tmp)
        _run([str(result.fc), *_FFLAGS, "-J", str(work), "-c",
              str(csrc_dir() / "xios.f90"), "-o", "xios.o"], work)
        _run([str(result.fc), "-shared", "-o", "libxios.so", "xios.o", f"-L{lib}",
              f"-Wl,-rpath,{lib}", "-lensio_ioclient"], work)
        ar = shutil.which("ar") or shutil.which("gcc-ar")
        if ar is None:
            raise BuildError("ioclient build: ar not found (needed for libxios.a)")
        _run([ar, "rcs", "libxios.a", "xios.o"], work)
        out = (lib / "libxios.so", lib / "libxios.a", inc / "xios.mod")
        _install(work / "libxios.so", out[0])
        _install(work / "libxios.a", out[1])
        _install(work / "xios.mod", out[2])
    return out


def xios_flags(result: BuildResult) -> str:
    """Flags for ``<fc> model.f90 <xios_flags>``: the xios module and library, the
    client, and MPI (as :attr:`~.build.BuildResult.fortran_flags`)."""
    return result.fortran_flags.replace("-lensio_ioclient", "-lxios -lensio_ioclient", 1)
