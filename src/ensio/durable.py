"""fsync by path: what makes a write, a creation or a rename survive a power loss.

One helper for every room that needs it (the journal and the library-path
rewrite of ``io/``, the to-do list, job file and staged outputs of
``workflow/``). Standard library only, so a worker job's start-up imports
nothing heavy for it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_path"]


def fsync_path(path: str | Path, *, directory: bool = False) -> None:
    """Flush ``path`` to stable storage.

    With ``directory=True`` ``path`` is a directory, and its entries (files
    created, renamed into or removed from it) become durable; a file's own
    fsync does not cover its name.
    """
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
