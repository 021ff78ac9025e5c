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
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ...durable import fsync_path, replacing
from ...layout.companions import Companion, changed_bytes, write_back
from ...layout.encoding import Encoding
from ...layout.state import StateLayout
from ..formats.open import open_member
from ..formats.store import MemberStore, VarInfo
from . import journal

__all__ = ["rewrite_copy", "rewrite_elements"]


def rewrite_copy(
    path: Path,
    layout: StateLayout,
    values: dict[str, np.ndarray],
    undo: journal.UndoLog | None,
    fsync: bool,
    encodings: Mapping[str, Encoding] | None = None,
    *,
    known: Mapping[str, VarInfo] | None = None,
    backend: type[MemberStore] | None = None,
    private: bool = False,
) -> dict[str, int]:
    """Write library-path variables into a copy of ``path`` and rename it into place.

    ``values`` are physical (NaN: keep the prior value) state rows of the
    layout's variables (:func:`rewrite_elements` with their active elements
    and their write-back companions; ``known``, ``backend``, ``private`` as there).
    """
    return rewrite_elements(
        path, {name: (layout.variable(name).active, full) for name, full in values.items()},
        undo, fsync, encodings,
        companions={name: layout.variable(name).companions for name in values},
        known=known, backend=backend, private=private,
    )  # fmt: skip


def rewrite_elements(
    path: Path,
    values: Mapping[str, tuple[np.ndarray | None, np.ndarray]],
    undo: journal.UndoLog | None,
    fsync: bool,
    encodings: Mapping[str, Encoding] | None = None,
    companions: Mapping[str, Sequence[Companion]] | None = None,
    *,
    known: Mapping[str, VarInfo] | None = None,
    backend: type[MemberStore] | None = None,
    private: bool = False,
) -> dict[str, int]:
    """Variables' elements ``values[name] = (elements, physical values)`` via a copy of ``path``.

    ``elements``: flat indices into the variable (None: all of it). Values
    are physical (NaN: keep the prior value), packed with the file's
    ``encodings`` (default: its own); ``companions[name]``: the elements that
    follow those (:func:`ensio.layout.companions.write_back`, whose
    ``source_rows`` index ``values[name][1]``). Returns the clips per variable.

    The new values are computed from the file as it is; if no stored byte
    changes (an analysis that changes nothing) the file is left untouched,
    byte-identical, with no copy and no journal entry. Otherwise only the
    variables that change are written, into a copy that replaces the file
    itself: a symlinked member stays a link to the rewritten file, and the
    copy keeps the file's permission bits and owner
    (:func:`ensio.durable.replacing`). The journal backs up that same file.

    ``known``: the file's variables as the scan found them (of this file or of
    the file it is a byte copy of), so it is not parsed again; ``backend``: its
    format as that scan found it (:func:`~ensio.io.formats.open.open_member`). ``private``: the
    file is a run's staged copy that no one reads before the run's commit
    renames it (:func:`ensio.io.products.products.write_member_copies`): the
    changed variables are written straight into it, without a second copy and
    rename. That is as safe: an interrupted run never commits, and its staged
    files are removed whole by the rollback, whatever state they were left in.
    """
    path = Path(os.path.realpath(path))
    companions = companions or {}
    # in a fixed order: the order of the writes decides where HDF5 puts the chunks,
    # so a set (hash order varies per process) would make the bytes vary with N_mpi
    written = list(dict.fromkeys([*values, *(c.target for name in values
                                             for c in companions.get(name, ()))]))
    if known is not None and not all(name in known for name in written):
        known = None
    store = open_member(path, writable=private, known=known, backend=backend)
    try:
        infos = known if known is not None else store.variables()
        encs = {name: (encodings or {}).get(name) or infos[name].encoding for name in written}
        stored = {name: store.read_elements(name, 0, infos[name].size) for name in written}
        before = {name: cur.copy() for name, cur in stored.items()}
        clips: dict[str, int] = {}
        for name, (elements, full) in values.items():
            rows_at = (np.arange(full.size, dtype=np.int64) if elements is None
                       else np.asarray(elements, dtype=np.int64))  # fmt: skip
            clips[name] = write_back(stored, encs, name, rows_at, full, companions.get(name, ()))
        changed = [name for name in stored if changed_bytes(stored[name], before[name]).any()]
        if private:  # straight into the staged file, through the handle that read it
            _write_changed(store, changed, stored)
    finally:
        store.close()
    if private and changed and fsync:
        fsync_path(path)
    if private or not changed:
        return clips
    if undo is not None:
        undo.save_file(path)
    with replacing(path, fsync=fsync, label="library") as tmp:
        shutil.copyfile(path, tmp)
        # a byte copy: the metadata ``known`` for the file holds for it too
        with open_member(tmp, writable=True, known=known, backend=backend) as copy:
            _write_changed(copy, changed, stored)
    return clips


def _write_changed(store: MemberStore, changed: Sequence[str],
                   stored: Mapping[str, np.ndarray]) -> None:
    """The ``changed`` variables' new values ``stored[name]`` (whole variables) into ``store``."""
    for name in changed:
        store.write_elements(name, 0, stored[name])
