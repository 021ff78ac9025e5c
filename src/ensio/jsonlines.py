"""Append-only JSON-lines files (the run record, a pool's job file), read leniently.

Standard library only: worker jobs and ``ensio recover`` import it without
numpy or MPI.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["read_json_lines"]


def read_json_lines(
    path: str | Path, keep: Callable[[dict[str, Any]], bool] = lambda entry: True
) -> list[dict[str, Any]]:
    """The JSON objects of ``path``, one per line, oldest first (none if it is missing).

    Why lenient: a line that is not a JSON object (written by hand, by another
    version, or cut by a crash) is skipped rather than failing every later
    reader; ``keep`` drops objects without the fields the caller needs.
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and keep(entry):
            out.append(entry)
    return out
