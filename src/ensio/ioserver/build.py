"""Build the C client library and the Fortran module of the I/O server.

The sources ship in the package (``ensio/ioserver/csrc``); ``ensio ioclient build
--prefix DIR`` compiles them with an MPI's compiler wrappers: ``--mpicc``/``--mpifort``,
else the environment's ``MPICC``/``MPIFC``, else the venv's ``mpicc`` (the mpich
wheel, which has no Fortran bindings: gfortran then compiles the module)::

    DIR/include/ensio_ioclient.h      DIR/include/ensio_ioclient.mod
    DIR/lib/libensio_ioclient.so      DIR/lib/libensio_ioclient.a
    DIR/lib/libensio_ioclient_py.so   (attached/sync modes and read_restart)
    DIR/include/xios.mod              DIR/lib/libxios.{so,a}

The last two are XIOS's Fortran interface (module ``xios``, ``csrc/xios.f90``) over
the client, so a model written against XIOS relinks with ``-lxios -lensio_ioclient``
(plus MPI) instead of XIOS's ``-lxios -lstdc++``. Both Fortran modules use the C
entry points' interfaces of ``csrc/ensio_ioclient_c.f90`` (installed as
``ensio_ioclient_c.mod``).

A site MPI (``--mpifort`` with Fortran bindings) lets a model that does ``use mpi`` /
``use mpi_f08`` compile against the module with the same compiler. The model, the
library and every Python process of the job (``ensio ioserver`` ranks, or the
interpreter the attached/sync modes embed) must use ONE MPI library: mpi4py's wheel
chooses it at import (``MPI4PY_LIBMPI``; in the embedded interpreter it finds the
model's). ``libensio_ioclient_py.so`` links this Python's ``libpython`` and remembers
the interpreter (``ENSIO_IOCLIENT_PYTHON`` overrides it at run time); the main library
loads it only when a config asks for attached or sync, or for ``read_restart``.

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
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import EnsioError

__all__ = ["BuildError", "BuildResult", "build_client", "build_xios", "csrc_dir", "mpi_flags",
           "run_compiler", "xios_flags"]

_SOURCES = ("ensio_ioclient.h", "ensio_ioclient_impl.h", "ensio_ioclient.c",
            "ensio_ioclient_modes.c", "ensio_ioclient_py.c", "ensio_ioclient_c.f90",
            "ensio_ioclient.f90")
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
    #: libensio_ioclient_py.so (None: this Python has no shared libpython).
    python_lib: Path | None = None

    @property
    def c_flags(self) -> str:
        """Flags for ``mpicc model.c <c_flags>``."""
        lib = self.shared_lib.parent
        return f"-I{self.header.parent} -L{lib} -Wl,-rpath,{lib} -lensio_ioclient"

    @property
    def fortran_flags(self) -> str:
        """Flags for ``<fc> model.f90 <fortran_flags>`` (the module, the library, and MPI
        unless ``fc`` is an MPI wrapper)."""
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


def run_compiler(cmd: list[str], cwd: Path, what: str = "ioclient build") -> str:
    """Run a compiler; BuildError (``what: …``) with its first error line on failure.
    Also the Fortran stencil model's build (``what="stencil build"``)."""
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise BuildError(f"{what}: cannot run {cmd[0]}: {exc.strerror}") from exc
    if proc.returncode != 0:
        lines = [x for x in (proc.stderr + proc.stdout).splitlines() if x.strip()]
        first = next((x for x in lines if "error" in x.lower()), lines[0] if lines else "")
        raise BuildError(f"{what}: {Path(cmd[0]).name} failed "
                         f"(exit {proc.returncode}): {first.strip()}")
    return proc.stdout


def mpi_flags(mpicc: Path) -> tuple[list[str], list[str]]:
    """Include (``-I``) and link flags of an MPI C wrapper, from ``mpicc -show``.

    Returns ``(includes, link)``: the Fortran compiler gets the includes, a Fortran
    model's link line the link flags (``-L``, ``-Wl,...``, ``-l``).
    """
    words = shlex.split(run_compiler([str(mpicc), "-show"], Path.cwd()))[1:]
    includes = [w for w in words if w.startswith("-I")]
    link = [w for w in words if w.startswith(("-L", "-l", "-Wl,"))]
    return includes, link


def _fortran_runtime(fc: Path, work: Path) -> list[str]:
    """Link flags of the Fortran runtime the module's objects need (libgfortran)."""
    lib = run_compiler([str(fc), "-print-file-name=libgfortran.so"], work).strip()
    if not os.path.isabs(lib):  # not a gfortran: let its driver be the linker's business
        return []
    d = os.path.dirname(lib)
    return [f"-L{d}", f"-Wl,-rpath,{d}", "-lgfortran"]


def _from_env(given: str | os.PathLike | None, var: str) -> str | os.PathLike | None:
    return given if given is not None else (os.environ.get(var) or None)


def _python_build(cc: Path, src: Path, work: Path, pylib: Path) -> bool:
    """Compile ``libensio_ioclient_py.so`` against this Python; False without libpython.so."""
    cv = sysconfig.get_config_var
    libdir, ver = cv("LIBDIR"), cv("LDVERSION") or cv("VERSION")
    if not cv("Py_ENABLE_SHARED") or not libdir:
        print(f"ioclient build: {sys.executable} has no shared libpython: attached/sync from "
              "C/Fortran and read_restart are not built", file=sys.stderr)
        return False
    include = sysconfig.get_paths()["include"]
    run_compiler([str(cc), *_CFLAGS, f"-I{include}",
          f'-DENSIO_IOCLIENT_PYTHON="{sys.executable}"', "-c",
          str(src / "ensio_ioclient_py.c"), "-o", "py.o"], work)
    run_compiler([str(cc), "-shared", "-o", pylib.name, "py.o", f"-L{libdir}",
          f"-Wl,-rpath,{libdir}", f"-lpython{ver}"], work)
    return True


def build_client(prefix: str | os.PathLike, mpicc: str | os.PathLike | None = None,
                 fc: str | os.PathLike | None = None,
                 mpifort: str | os.PathLike | None = None) -> BuildResult:
    """Compile the client into ``prefix`` (lib/ and include/, created as needed).

    Parameters
    ----------
    prefix : path
        Installation prefix.
    mpicc : path, optional
        MPI C compiler wrapper; default ``$MPICC``, else the ``mpicc`` next to
        ``sys.executable`` (the mpich wheel's).
    fc : path, optional
        Fortran compiler for the module when there is no MPI Fortran wrapper;
        default ``gfortran`` on PATH.
    mpifort : path, optional
        MPI Fortran wrapper (``$MPIFC`` by default): compiles the module, and the
        model with it, so ``use mpi`` / ``use mpi_f08`` work. Takes the place of ``fc``.

    Raises
    ------
    BuildError
        A compiler is missing or fails (one line).
    """
    cc = _tool(_from_env(mpicc, "MPICC"), str(Path(sys.executable).parent / "mpicc"),
               "MPI C compiler", "--mpicc")
    wrapper = _from_env(mpifort, "MPIFC")
    fort = (_tool(wrapper, "mpifort", "MPI Fortran compiler", "--mpifort") if wrapper
            else _tool(fc, "gfortran", "Fortran compiler", "--fc"))
    prefix = Path(prefix).resolve()
    src = csrc_dir()
    includes, link = mpi_flags(cc)
    pylib = prefix / "lib" / "libensio_ioclient_py.so"
    cflags = [*_CFLAGS, f'-DENSIO_IOCLIENT_PYLIB="{pylib}"']
    with tempfile.TemporaryDirectory(prefix="ensio-ioclient-") as tmp:
        work = Path(tmp)
        for source, obj in (("ensio_ioclient.c", "c.o"), ("ensio_ioclient_modes.c", "m.o")):
            run_compiler([str(cc), *cflags, "-c", str(src / source), "-o", obj], work)
        for source, obj in (("ensio_ioclient_c.f90", "fc.o"), ("ensio_ioclient.f90", "f.o")):
            run_compiler([str(fort), *_FFLAGS, *([] if wrapper else includes), "-J", str(work),
                  "-I", str(work), "-c", str(src / source), "-o", obj], work)
        run_compiler([str(cc), "-shared", "-o", "libensio_ioclient.so", "c.o", "m.o", "fc.o", "f.o",
              "-ldl",
              *_fortran_runtime(fort, work)], work)
        embedded = _python_build(cc, src, work, pylib)
        ar = shutil.which("ar") or shutil.which("gcc-ar")
        if ar is None:
            raise BuildError("ioclient build: ar not found (needed for libensio_ioclient.a)")
        run_compiler([ar, "rcs", "libensio_ioclient.a", "c.o", "m.o", "fc.o", "f.o"], work)
        result = BuildResult(
            prefix=prefix, shared_lib=prefix / "lib" / "libensio_ioclient.so",
            static_lib=prefix / "lib" / "libensio_ioclient.a",
            header=prefix / "include" / "ensio_ioclient.h",
            module=prefix / "include" / "ensio_ioclient.mod", mpicc=cc, fc=fort,
            mpi_link=() if wrapper else tuple(link),
            python_lib=pylib if embedded else None)
        _install(work / "libensio_ioclient.so", result.shared_lib)
        _install(work / "libensio_ioclient.a", result.static_lib)
        _install(src / "ensio_ioclient.h", result.header)
        _install(work / "ensio_ioclient.mod", result.module)
        # the interfaces both Fortran modules use: needed beside them by a compiler
        _install(work / "ensio_ioclient_c.mod", result.module.with_name("ensio_ioclient_c.mod"))
        if embedded:
            _install(work / pylib.name, pylib)
    build_xios(result)  # XIOS's module (xios.mod, libxios) over the client
    return result


def _install(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` through a temporary name: a running model never maps half a file."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp{os.getpid()}")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def build_xios(result: BuildResult) -> tuple[Path, Path, Path]:
    """Compile ``xios.f90`` with the client's Fortran compiler into ``result.prefix``.

    Returns ``(libxios.so, libxios.a, xios.mod)``; a compiler failure is a
    :class:`~.build.BuildError` (one line).
    """
    lib = result.shared_lib.parent
    inc = result.header.parent
    with tempfile.TemporaryDirectory(prefix="ensio-xios-") as tmp:
        work = Path(tmp)
        run_compiler([str(result.fc), *_FFLAGS, "-J", str(work), "-I", str(inc), "-c",
              str(csrc_dir() / "xios.f90"), "-o", "xios.o"], work)
        run_compiler([str(result.fc), "-shared", "-o", "libxios.so", "xios.o", f"-L{lib}",
              f"-Wl,-rpath,{lib}", "-lensio_ioclient"], work)
        ar = shutil.which("ar") or shutil.which("gcc-ar")
        if ar is None:
            raise BuildError("ioclient build: ar not found (needed for libxios.a)")
        run_compiler([ar, "rcs", "libxios.a", "xios.o"], work)
        out = (lib / "libxios.so", lib / "libxios.a", inc / "xios.mod")
        _install(work / "libxios.so", out[0])
        _install(work / "libxios.a", out[1])
        _install(work / "xios.mod", out[2])
    return out


def xios_flags(result: BuildResult) -> str:
    """Flags for ``<fc> model.f90 <xios_flags>``: the xios module and library, the
    client, and MPI (as :attr:`~.build.BuildResult.fortran_flags`)."""
    return result.fortran_flags.replace("-lensio_ioclient", "-lxios -lensio_ioclient", 1)
