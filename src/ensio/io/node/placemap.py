"""Which rank's node-local directory holds which member file (one home for the rule).

The ensemble's files, member-major, are numbered ``f = m * P + p`` (m the
member's 0-based position in ``ensemble.numbers``, p the tile, P the tile
count; P = 1 and p = 0 for untiled members). In a run of R ranks,

* file f belongs to rank ``f mod R``; with R = N_e × P (``io.mode: shuffle``)
  rank r = m·P + p therefore holds tile p of member m, and ranks beyond
  N_e × P hold nothing; with fewer ranks the files go round-robin;
* its local copy is ``io.local_dir`` (``{host}``, ``{rank}`` filled with the
  holder rank and its host; relative patterns from the config's directory)
  joined with the file's *name* (the last component of its global path).
  Two files that would land on one local path are a config error.

``ensio stage`` copies between the global paths and these local ones, the
backup (:mod:`ensio.io.node.backup`) copies each rank's files, and a restore puts
them back where this rule says; the shuffle reader must use the same rule.
Backups name files by their path relative to the directory all global
member files share (:attr:`PlacedFile.rel`), which is unique.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...config.errors import ConfigError
from ...config.schema import Config, EnsembleSection

__all__ = ["PlacedFile", "ensemble_files", "format_local_dir", "holder_rank", "place_files"]


@dataclass(frozen=True)
class PlacedFile:
    """One member file and where it lives on the nodes.

    ``tile`` is None for an untiled member; ``local`` is None when
    ``io.local_dir`` is not set; ``rel`` is the backup name.
    """

    index: int
    member: int
    tile: int | None
    rank: int
    host: str
    global_path: Path
    local: Path | None
    rel: str


def holder_rank(index: int, n_ranks: int) -> int:
    """The rank whose local directory holds file ``index`` (f = m·P + p) of the ensemble."""
    return index % n_ranks


def format_local_dir(pattern: str, base: Path, *, rank: int, host: str) -> Path:
    """``io.local_dir`` for ``rank`` on ``host`` (relative patterns from ``base``)."""
    try:
        text = pattern.format(rank=rank, host=host)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"io.local_dir: pattern {pattern!r} takes only {{host}} and {{rank}} ({exc})"
        ) from None
    p = Path(text)
    return p if p.is_absolute() else base / p


def ensemble_files(ens: EnsembleSection, base: Path) -> list[tuple[int, int | None, Path]]:
    """(member, tile or None, global path) of every file, member-major (f = m·P + p)."""
    if not ens.tiled:
        return [(m, None, ens.member_path(m, base)) for m in ens.numbers]
    from ..scan.memberfiles import (
        tile_count,  # reads member 1's attributes when tiles are not declared
    )

    n_tiles = tile_count(ens, base)
    return [(m, t, ens.tile_path(m, t, base)) for m in ens.numbers for t in range(n_tiles)]


def place_files(config: Config, hosts: Sequence[str]) -> list[PlacedFile]:
    """Every file of the ensemble with its holder rank and local path, for ``len(hosts)`` ranks.

    ``hosts[r]`` is the host of rank r (what ``{host}`` stands for there).
    """
    files = ensemble_files(config.ensemble, config.base_dir)
    paths = [Path(os.path.abspath(p)) for _, _, p in files]
    common = Path(os.path.commonpath([p.parent for p in paths]))
    pattern = config.io.local_dir
    placed, seen = [], dict[Path, Path]()
    for f, ((member, tile, _), path) in enumerate(zip(files, paths, strict=True)):
        rank = holder_rank(f, len(hosts))
        local = None
        if pattern is not None:
            local = format_local_dir(pattern, config.base_dir, rank=rank,
                                     host=hosts[rank]) / path.name
            if local in seen:
                raise ConfigError(
                    f"io.local_dir: {seen[local]} and {path} would both be {local}; give "
                    "the files distinct names or put {rank} in io.local_dir"
                )
            seen[local] = path
        placed.append(PlacedFile(f, member, tile, rank, hosts[rank], path, local,
                                 path.relative_to(common).as_posix()))
    return placed
