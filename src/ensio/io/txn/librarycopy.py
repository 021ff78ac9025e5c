"""Rewrite variables of one file through the netCDF library: a copy, renamed into place.

Chunked or compressed variables cannot be written as byte ranges (HDF5 may
move a chunk whose size changes), so they are written into a copy of the
file, which then replaces it (:func:`ensio.durable.replacing`); the undo
journal saves the original as a whole file first. Shared by the files
mode (:mod:`ensio.io.modes.rewrite`) and tiles (:mod:`ensio.io.tiles.tilerewrite`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ...durable import replacing
from ...layout.encoding import Encoding
from ...layout.state import StateLayout
from ..formats.open import open_member
from ..formats.store import MemberStore
from . import journal

__all__ = ["rewrite_copy", "rewrite_elements"]


def rewrite_copy(
    path: Path,
    layout: StateLayout,
    values: dict[str, np.ndarray],
    undo: journal.UndoLog | None,
    fsync: bool,
    encodings: Mapping[str, Encoding] | None = None,
) -> dict[str, int]:
    """Write library-path variables into a copy of ``path`` and rename it into place.

    ``values`` are physical (NaN: keep the prior value) state rows of the
    layout's variables (:func:`rewrite_elements` with their active elements).
    """
    return rewrite_elements(
        path, {name: (layout.variable(name).active, full) for name, full in values.items()},
        undo, fsync, encodings,
    )  # fmt: skip


def rewrite_elements(
    path: Path,
    values: Mapping[str, tuple[np.ndarray | None, np.ndarray]],
    undo: journal.UndoLog | None,
    fsync: bool,
    encodings: Mapping[str, Encoding] | None = None,
) -> dict[str, int]:
    """Variables' elements ``values[name] = (elements, physical values)`` via a copy of ``path``.

    ``elements``: flat indices into the variable (None: all of it). Values
    are physical (NaN: keep the prior value), packed with the file's
    ``encodings`` (default: its own). Returns the clips per variable. The
    copy replaces the file itself: a symlinked member stays a link to the
    rewritten file, and the copy keeps the file's permission bits and owner
    (:func:`ensio.durable.replacing`). The journal backs up that same file.
    """
    path = Path(os.path.realpath(path))
    if undo is not None:
        undo.save_file(path)
    clips: dict[str, int] = {}
    with replacing(path, fsync=fsync, label="library") as tmp:
        shutil.copyfile(path, tmp)
        with open_member(tmp, writable=True) as store:
            infos = store.variables()
            for name, (elements, full) in values.items():
                enc = (encodings or {}).get(name) or infos[name].encoding
                clips[name] = _store_elements(store, name, infos[name].size, elements, full, enc)
    return clips


def _store_elements(
    store: MemberStore, name: str, size: int, elements: np.ndarray | None, full: np.ndarray,
    enc: Encoding,
) -> int:  # fmt: skip
    """``full`` into ``elements`` (None: all ``size``) of the variable, packed; the clips.

    Elements not listed (masked points, a tile's halo), NaN values (inactive
    rows) and unchanged packed values keep their stored values.
    """
    cur = store.read_elements(name, 0, size)
    prior = cur if elements is None else cur[elements]
    new = np.empty_like(prior)
    clips = enc.encode(full, new)
    enc.keep_prior(prior, full, new)
    if elements is None:
        cur = new
    else:
        cur[elements] = new
    store.write_elements(name, 0, cur)
    return clips
