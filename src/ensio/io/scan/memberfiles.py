"""Which files an ensemble is: its members, or each member's P tile files.

The lowest room that needs it: the run record fingerprints these files, the
tiled scan validates them, node-local staging places them. Reading P from
NEMO's ``DOMAIN_number_total`` opens member 1's first tile, nothing more.
"""

from __future__ import annotations

from pathlib import Path

import netCDF4
import numpy as np

from ...config.schema import EnsembleSection
from ...errors import InputError

__all__ = ["file_exists", "member_files", "tile_count"]


def file_exists(path: Path) -> None:
    """A missing tile named before netCDF4's less telling ``FileNotFoundError``."""
    if not path.is_file():
        raise InputError(f"{path}: tile file not found")


def tile_count(ens: EnsembleSection, base: Path) -> int:
    """P: declared, or ``DOMAIN_number_total`` of member 1's tile 0."""
    if ens.tiles is not None:
        return ens.tiles.count
    first = ens.tile_path(ens.numbers[0], 0, base)
    file_exists(first)
    with netCDF4.Dataset(first) as ds:
        if "DOMAIN_number_total" not in ds.ncattrs():
            raise InputError(
                f"{first}: ensemble.members has {{tile}} but no decomposition: declare "
                "ensemble.tiles or give the files NEMO's DOMAIN_* global attributes "
                "(DOMAIN_number_total missing)"
            )
        return int(np.asarray(ds.getncattr("DOMAIN_number_total")).ravel()[0])


def member_files(ens: EnsembleSection, base: Path) -> list[Path]:
    """Every file of the ensemble, member-major: the members, or each member's P tiles.

    What the offline driver journals, locks and fingerprints; the first is
    the journal's anchor (:func:`ensio.io.txn.journal.journal_root`).
    """
    if not ens.tiled:
        return ens.member_paths(base)
    p = tile_count(ens, base)
    return [ens.tile_path(m, t, base) for m in ens.numbers for t in range(p)]
