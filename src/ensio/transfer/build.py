"""Build the ``LD_PRELOAD`` interposer on first use, into the user's cache.

The C sources ship in the package (``ensio/transfer/csrc``). ``ensio run`` (and
``ensio transfer build``) compile them with the system C compiler (``$CC``, else
``cc``, else ``gcc``) into ``$XDG_CACHE_HOME/ensio`` (``~/.cache/ensio``), named by a
hash of the sources, the flags and the compiler: a changed source or compiler gives
a new library, and a library being used by running programs is never overwritten.
The build prints one line (DESIGN.md: native code is never built silently); a
missing or failing compiler is one line naming it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import TransferError

__all__ = ["SOURCES", "cache_dir", "compile_into", "csrc_dir", "find_compiler", "interposer"]

SOURCES = ("ensio_interpose.h", "ensio_interpose.c", "ensio_interpose_paths.c",
           "ensio_interpose_names.c", "ensio_interpose_stdio.c", "ensio_interpose_daemon.c",
           "ensio_interpose_writes.c", "ensio_interpose_partial.c",
           "ensio_interpose_consume.c", "ensio_interpose_dirs.c",
           "ensio_interpose_glob.c", "ensio_interpose_xattr.c")
_FLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-fvisibility=hidden", "-U_FORTIFY_SOURCE")
_LIBS = ("-ldl", "-lpthread")


def csrc_dir() -> Path:
    """The directory of the shipped interposer sources."""
    return Path(__file__).resolve().parent / "csrc"


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/ensio``, else ``~/.cache/ensio``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ensio"


def find_compiler(cc: str | None = None) -> Path:
    """The C compiler: ``cc`` if given, else ``$CC``, else ``cc`` or ``gcc`` on PATH."""
    names = [cc] if cc else [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc"]
    for name in names:
        found = shutil.which(name)
        if found:
            return Path(found)
    raise TransferError(
        f"no C compiler found ({' or '.join(names)}) to build the transfer interposer "
        f"from {csrc_dir()}: install one (e.g. gcc) or set CC")


def _digest(cc: Path) -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0" + (csrc_dir() / name).read_bytes() + b"\0")
    st = cc.resolve().stat()
    h.update(f"{' '.join(_FLAGS + _LIBS)}\0{cc.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def interposer(cc: str | None = None, cache: str | os.PathLike | None = None) -> Path:
    """The interposer library, built first if the cache has none for these sources.

    Raises
    ------
    TransferError
        No compiler, or it failed (its first error line).
    """
    compiler = find_compiler(cc)
    out_dir = Path(cache) if cache is not None else cache_dir()
    lib = out_dir / f"ensio_interpose-{_digest(compiler)}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = [str(csrc_dir() / n) for n in SOURCES if n.endswith(".c")]
    return compile_into(compiler, [*_FLAGS, *sources, *_LIBS], lib, "the transfer interposer")


def compile_into(compiler: Path, args: list[str], target: Path, what: str) -> Path:
    """``compiler args -o target``, built under a temporary name beside ``target`` and
    renamed into place (atomic: a concurrent build of the same sources is harmless).

    Raises
    ------
    TransferError
        The compiler cannot run, or failed: one line naming ``what`` and its first error.
    """
    print(f"ensio: building {what} with {compiler} -> {target}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix=".ensio-build-", dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        try:
            proc = subprocess.run([str(compiler), *args, "-o", str(built)], capture_output=True,
                                  text=True, check=False)
        except OSError as exc:
            raise TransferError(f"cannot run the C compiler {compiler}: {exc.strerror}") from None
        if proc.returncode != 0:
            lines = [x for x in (proc.stderr + proc.stdout).splitlines() if x.strip()]
            first = next((x for x in lines if "error" in x.lower()), lines[0] if lines else "")
            raise TransferError(f"building {what} failed ({compiler.name}, "
                                f"exit {proc.returncode}): {first.strip()}")
        os.replace(built, target)
    return target
