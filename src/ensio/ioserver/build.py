"""Build the C client library and the Fortran module of the I/O server.

The sources ship in the package (``ensio/ioserver/csrc``); ``ensio ioclient build
--prefix DIR`` compiles them with the MPI compiler wrapper of the MPI the servers run
on (the venv's ``mpicc`` by default: a model must link the same MPI library as the
Python servers of its MPMD job) and gfortran for the module::

    DIR/include/ensio_ioclient.h      DIR/include/ensio_ioclient.mod
    DIR/lib/libensio_ioclient.so      DIR/lib/libensio_ioclient.a

Built on request, never silently (DESIGN.md, native code). The Fortran module needs
no Fortran MPI bindings: communicators cross as integers (``MPI_Comm_f2c`` in the C
library), so it builds against a pip MPICH that has none.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import EnsioError

__all__ = ["BuildError", "BuildResult", "build_client", "csrc_dir", "mpi_flags"]

_SOURCES = ("ensio_ioclient.h", "ensio_ioclient.c", "ensio_ioclient.f90")
_CFLAGS = ("-std=c99", "-D_POSIX_C_SOURCE=200809L", "-O2", "-fPIC", "-Wall")
_FFLAGS = ("-O2", "-fPIC", "-Wall")


class BuildError(EnsioError):
    """A compiler is missing or failed: one line naming the compiler (and its first error)."""


@dataclass(frozen=True)
class BuildResult:
    """What ``build_client`` installed, and how a model compiles against it."""

    prefix: Path
    shared_lib: Path
    static_lib: Path
    header: Path
    module: Path
    mpicc: Path
    fc: Path
    mpi_link: tuple[str, ...] = ()


    @property
    def c_flags(self) -> str:
        """Flags for ``mpicc model.c <c_flags>``."""
        lib = self.shared_lib.parent
        return f"-I{self.header.parent} -L{lib} -Wl,-rpath,{lib} -lensio_ioclient"

    @property
    def fortran_flags(self) -> str:
        """Flags for ``gfortran model.f90 <fortran_flags>`` (the module, the library, MPI)."""
        return " ".join((self.c_flags, *self.mpi_link))


def csrc_dir() -> Path:
    """The directory of the shipped C and Fortran sources."""
    return Path(__file__).resolve().parent / "csrc"


def _tool(given: str | os.PathLike | None, default: str, what: str, flag: str) -> Path:
    """Resolve a compiler: the given path or name, else ``default``; BuildError if missing."""
    name = os.fspath(given) if given is not None else default
    found = shutil.which(name)
    if not found:
        raise BuildError(f"ioclient build: {what} not found: {name} (choose one with {flag})")
    return Path(found)


def _run(cmd: list[str], cwd: Path) -> str:
    """Run a compiler; BuildError with its first error line on failure."""
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise BuildError(f"ioclient build: cannot run {cmd[0]}: {exc.strerror}") from exc
    if proc.returncode != 0:
        lines = [x for x in (proc.stderr + proc.stdout).splitlines() if x.strip()]
        first = next((x for x in lines if "error" in x.lower()), lines[0] if lines else "")
        raise BuildError(f"ioclient build: {Path(cmd[0]).name} failed "
                         f"(exit {proc.returncode}): {first.strip()}")
    return proc.stdout


def mpi_flags(mpicc: Path) -> tuple[list[str], list[str]]:
    """Include (``-I``) and link flags of an MPI C wrapper, from ``mpicc -show``.

    Returns ``(includes, link)``: the Fortran compiler gets the includes, a Fortran
    model's link line the link flags (``-L``, ``-Wl,...``, ``-l``).
    """
    words = shlex.split(_run([str(mpicc), "-show"], Path.cwd()))[1:]
    includes = [w for w in words if w.startswith("-I")]
    link = [w for w in words if w.startswith(("-L", "-l", "-Wl,"))]
    return includes, link


def _fortran_runtime(fc: Path, work: Path) -> list[str]:
    """Link flags of the Fortran runtime the module's objects need (libgfortran)."""
    lib = _run([str(fc), "-print-file-name=libgfortran.so"], work).strip()
    if not os.path.isabs(lib):  # not a gfortran: let its driver be the linker's business
        return []
    d = os.path.dirname(lib)
    return [f"-L{d}", f"-Wl,-rpath,{d}", "-lgfortran"]


def build_client(prefix: str | os.PathLike, mpicc: str | os.PathLike | None = None,
                 fc: str | os.PathLike | None = None) -> BuildResult:
    """Compile the client into ``prefix`` (lib/ and include/, created as needed).

    Parameters
    ----------
    prefix : path
        Installation prefix.
    mpicc : path, optional
        MPI C compiler wrapper; default the ``mpicc`` next to ``sys.executable`` (the
        MPI mpi4py, and therefore the servers, use).
    fc : path, optional
        Fortran compiler for the module; default ``gfortran`` on PATH.

    Raises
    ------
    BuildError
        A compiler is missing or fails (one line).
    """
    cc = _tool(mpicc, str(Path(sys.executable).parent / "mpicc"), "MPI C compiler", "--mpicc")
    fort = _tool(fc, "gfortran", "Fortran compiler", "--fc")
    prefix = Path(prefix).resolve()
    src = csrc_dir()
    includes, link = mpi_flags(cc)
    with tempfile.TemporaryDirectory(prefix="ensio-ioclient-") as tmp:
        work = Path(tmp)
        _run([str(cc), *_CFLAGS, "-c", str(src / "ensio_ioclient.c"), "-o", "c.o"], work)
        _run([str(fort), *_FFLAGS, *includes, "-J", str(work), "-c",
              str(src / "ensio_ioclient.f90"), "-o", "f.o"], work)
        _run([str(cc), "-shared", "-o", "libensio_ioclient.so", "c.o", "f.o",
              *_fortran_runtime(fort, work)], work)
        ar = shutil.which("ar") or shutil.which("gcc-ar")
        if ar is None:
            raise BuildError("ioclient build: ar not found (needed for libensio_ioclient.a)")
        _run([ar, "rcs", "libensio_ioclient.a", "c.o", "f.o"], work)
        result = BuildResult(
            prefix=prefix, shared_lib=prefix / "lib" / "libensio_ioclient.so",
            static_lib=prefix / "lib" / "libensio_ioclient.a",
            header=prefix / "include" / "ensio_ioclient.h",
            module=prefix / "include" / "ensio_ioclient.mod", mpicc=cc, fc=fort,
            mpi_link=tuple(link))
        _install(work / "libensio_ioclient.so", result.shared_lib)
        _install(work / "libensio_ioclient.a", result.static_lib)
        _install(src / "ensio_ioclient.h", result.header)
        _install(work / "ensio_ioclient.mod", result.module)
    from .xiosbuild import build_xios  # XIOS's module (xios.mod, libxios) over the client

    build_xios(result)
    return result


def _install(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` through a temporary name: a running model never maps half a file."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp{os.getpid()}")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
