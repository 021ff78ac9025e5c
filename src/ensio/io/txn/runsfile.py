"""The run record's file: its name and its lines (standard library only).

:mod:`ensio.io.txn.runrecord` writes the record and decides "already analysed"
from it; the recovery of a local shuffle journal
(:mod:`ensio.io.txn.shufflejournal`) reads it too, to learn whether a
transaction committed, and must not need MPI or netCDF for that (``ensio
recover`` starts without them). So the file's name and its reader live here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...jsonlines import read_json_lines

__all__ = ["RUNS_NAME", "read_entries", "runs_path"]

RUNS_NAME = ".ensio-runs.jsonl"


def runs_path(root: str | Path) -> Path:
    """The run record of the ensemble whose journal root (global directory) is ``root``."""
    return Path(os.path.abspath(root)) / RUNS_NAME


def read_entries(root: str | Path) -> list[dict[str, Any]]:
    """Every entry of the record, oldest first (none if there is no record).

    A line that is not JSON (written by hand or by another version) is
    ignored; the record is replaced atomically, so it is never torn.
    """
    return read_json_lines(runs_path(root))
