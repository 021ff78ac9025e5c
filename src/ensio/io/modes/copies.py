"""Byte copies of member files, spread over the ranks (analysis copies, ``io.in_place: false``).

Its own module because both the single-file copies (:mod:`ensio.io.products.products`)
and the tiled ones (:mod:`ensio.io.modes.tiledio`) need it, and the ensemble-I/O
modules must not import the product writer: so it lives in modes/, below products/.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from ...errors import file_op

__all__ = ["copy_members"]


def copy_members(sources: Sequence[Path], targets: Sequence[Path], rank: int, size: int) -> None:
    """Copy member files (this rank's share: every ``size``-th from ``rank``)."""
    for m in range(rank, len(sources), size):
        with file_op("write", targets[m]):
            targets[m].parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(sources[m], targets[m])
