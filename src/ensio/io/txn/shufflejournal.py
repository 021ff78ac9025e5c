"""The local journal of a shuffle transaction: its marker and how recovery decides.

In ``io.mode: shuffle`` every local directory holds its own undo journal
(:mod:`ensio.io.txn.journal`), but one run writes many directories, so no local
``COMMITTED`` marker can decide for all of them. Instead each local journal
starts with ``SHUFFLE``: the transaction id and the absolute global
directory (where the member files live on the global file system). The run
commits by appending an entry with that id to the global run record
(:mod:`ensio.io.txn.runsfile`); recovery of a local journal with a marker asks
the record: the id is there → the analysis is complete, drop the journal
(roll forward); it is not → restore the prior bytes (roll back). Every local
directory of one run therefore ends on the same side, whatever the moment of
a kill (:mod:`ensio.io.txn.shufflecommit` writes the marker, the decision and
drops the journals).

The decision is read under the global ensemble lock, so a run that is still
alive cannot append the id after recovery has rolled a directory back: the
lock is taken for the look-up unless this process holds it or the caller
says its run holds it (``locked``). An unreachable global directory is a
one-line error and nothing is changed: recovery never guesses.

Standard library only (``ensio recover`` starts without MPI or netCDF).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ... import faults
from ...durable import fsync_path
from ...locks import EnsembleLock, command_line, held_by_me
from . import marker as markers
from .runsfile import read_entries
from .undolog import JournalError

__all__ = ["MARKER_NAME", "ShuffleMarker", "committed", "recorded"]

MARKER_NAME = "SHUFFLE"


@dataclass(frozen=True)
class ShuffleMarker:
    """Which transaction a local journal belongs to, and where it is decided.

    Written and read through the one marker writer and reader
    (:mod:`ensio.io.txn.marker`), as ``<journal>/SHUFFLE``.
    """

    txid: str
    global_root: str  # absolute

    def write(self, jdir: Path, *, fsync: bool) -> None:
        """Create the journal directory ``jdir`` with this marker, before any undo record.

        The marker appears atomically (written to a temporary name, renamed), so
        a journal either has a whole marker or none; one without a marker holds
        no undo record yet (it is rolled back as an ordinary journal: nothing).
        Raises FileExistsError if ``jdir`` exists (recover first).
        """
        os.mkdir(jdir)
        record = {"txid": self.txid, "global_root": self.global_root}
        markers.write_marker(jdir / MARKER_NAME, record, fsync=fsync,
                             label="shuffle-marker-file")
        if fsync:
            fsync_path(jdir.parent, directory=True)
        faults.point("shuffle-marker")

    @classmethod
    def read(cls, jdir: Path) -> ShuffleMarker | None:
        """The marker of the journal ``jdir``, or None (an ordinary journal)."""
        raw = markers.read_marker(
            jdir / MARKER_NAME, what="shuffle marker", error=JournalError,
            fields=("txid", "global_root"),
            hint="; nothing changed (inspect it before removing the journal)")
        return None if raw is None else cls(str(raw["txid"]), str(raw["global_root"]))


def recorded(root: Path, txid: str) -> bool:
    """True if the run record of the global directory ``root`` holds transaction ``txid``."""
    return any(e.get("txid") == txid for e in read_entries(root))


def committed(jdir: Path, marker: ShuffleMarker, *, locked: Path | None = None) -> bool:
    """True if the transaction of ``marker`` committed (its id is in the global record).

    ``locked`` is the global directory whose lock the caller's run holds
    (taken by another rank of it). Raises :class:`JournalError` if the global
    directory is unreachable, :class:`~ensio.locks.LockError` if a live run
    holds its lock.
    """
    root = Path(marker.global_root)
    local = jdir.parent
    if not root.is_dir():
        raise JournalError(
            f"{jdir}: shuffle transaction {marker.txid} is decided in the global directory "
            f"{root}, which is not reachable from here; nothing changed (make it visible "
            f"and run `ensio recover {local}` again)")
    if locked is not None and os.path.abspath(locked) != os.path.abspath(root):
        raise JournalError(
            f"{jdir}: journal of a run on another ensemble (global directory {root}); "
            f"nothing changed: run `ensio recover {local}`")
    if locked is not None or held_by_me(root):
        return recorded(root, marker.txid)
    with EnsembleLock(root, f"journal recovery in {command_line()}"):
        return recorded(root, marker.txid)
