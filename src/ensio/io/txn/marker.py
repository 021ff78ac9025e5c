"""Commit markers: the one way a writer of ensio records "this is decided".

Every commit point of ensio is a marker file that appears atomically, whole
or not at all, after everything it vouches for is durable: the journal's
``COMMITTED`` (empty: its existence is the decision), the shuffle journal's
``SHUFFLE`` (which transaction, where it is decided), the backup's
``COMPLETE`` (what the backup holds). :func:`write_marker` writes one
(:func:`ensio.durable.atomic_write`: a temporary sibling renamed into place);
:func:`read_marker` is the one reader: None when there is none, the record
(``{}`` for an empty marker) otherwise, and one line naming the file, raised
as the caller's error, when it is unreadable, so recovery never guesses.

Standard library only (``ensio recover`` starts without MPI or netCDF).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...durable import atomic_write

__all__ = ["read_marker", "write_marker"]


def write_marker(path: Path, record: Mapping[str, Any], *, fsync: bool, label: str,
                 indent: int | None = None) -> None:
    """Publish the marker ``path`` holding ``record`` (JSON), atomically.

    Fault points ``<label>-written``/``-renamed`` (and ``-synced``,
    ``-dir-synced`` with ``fsync``) mark its steps for the kill tests.
    """
    atomic_write(path, json.dumps(dict(record), indent=indent), fsync=fsync, label=label)


def read_marker(path: Path, *, what: str, error: Callable[[str], Exception],
                fields: tuple[str, ...] = (), hint: str = "") -> dict[str, Any] | None:
    """The record of the marker ``path``; None if there is none.

    An empty file is the record ``{}`` (a marker whose existence is all it
    says). A marker that is not a JSON object, or lacks one of ``fields``,
    raises ``error("<path>: unreadable <what> (...)<hint>")``.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise error(f"{path}: unreadable {what} ({exc.strerror or exc}){hint}") from None
    if not text.strip():
        record: Any = {}
    else:
        try:
            record = json.loads(text)
        except ValueError as exc:
            raise error(f"{path}: unreadable {what} ({exc}){hint}") from None
    if not isinstance(record, dict):
        raise error(f"{path}: unreadable {what} (not a JSON object){hint}")
    missing = [f for f in fields if f not in record]
    if missing:
        raise error(f"{path}: unreadable {what} (no {', '.join(missing)}){hint}")
    return record
