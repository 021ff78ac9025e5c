"""Build ``ensio-launch``, the native companion of ``ensio run --transfer`` (issue 28 item 2).

``csrc/ensio_launch.c`` checks the same launch record as :mod:`.launch` and execs
COMMAND without starting Python (about a millisecond); on anything else it execs the
full path, ``python -m ensio.cli.main run``, of the interpreter and source directory
it was built for (compiled in: ``-DENSIO_PYTHON``, ``-DENSIO_SRC``). It is built on
first use (``ensio run --launcher`` prints its path) into the interposer's cache, named
by a hash of its source, the flags (so the interpreter) and the compiler, with the
same visible line and one-line errors as :func:`.build.interposer`.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from .build import cache_dir, compile_into, csrc_dir, find_compiler
from .errors import TransferError

__all__ = ["SOURCE", "launcher"]

SOURCE = "ensio_launch.c"


def _flags() -> tuple[str, ...]:
    python = sys.executable
    src = str(Path(__file__).resolve().parents[2])
    for name, value in (("the Python interpreter", python), ("the source directory", src)):
        if any(c in value for c in '"\\\n'):
            raise TransferError(f"cannot build ensio-launch: {name} {value!r} has a quote, "
                                "backslash or newline in its path")
    return ("-O2", "-Wall", f'-DENSIO_PYTHON="{python}"', f'-DENSIO_SRC="{src}"')


def launcher(cc: str | None = None, cache: str | os.PathLike | None = None) -> Path:
    """The ``ensio-launch`` executable, built first if the cache has none for this source,
    interpreter and compiler.

    Raises
    ------
    TransferError
        No compiler, or it failed (its first error line).
    """
    compiler = find_compiler(cc)
    flags = _flags()
    source = csrc_dir() / SOURCE
    h = hashlib.sha256(source.read_bytes())
    st = compiler.resolve().stat()
    h.update(f"\0{' '.join(flags)}\0{compiler.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    out_dir = Path(cache) if cache is not None else cache_dir()
    exe = out_dir / f"ensio-launch-{h.hexdigest()[:16]}"
    if exe.exists():
        return exe
    out_dir.mkdir(parents=True, exist_ok=True)
    return compile_into(compiler, [*flags, str(source)], exe, "ensio-launch")
