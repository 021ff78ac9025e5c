"""Tile-file metadata: every tile of every member checked once, spread over the ranks.

Why: with tiled members a read of N_e members touches N_e × P small files.
Opening each through the netCDF library costs milliseconds (4 ms for a
netCDF-4 tile, 0.4 ms for CDF-5), more than moving its data from the page
cache. As for single-file members (:class:`~ensio.io.scan.members.MemberScan`),
the files are therefore checked in a metadata pass, shared by all ranks, and
the data path only issues ``pread``/``pwrite`` at the offsets found there.

Tile t of member 1 is checked fully and becomes the **template** of tile
index t (:mod:`ensio.io.scan.quickcheck`); tile t of every other member is the
same program's output for the same sub-domain, so it is accepted by the
quick check (identical metadata bytes, or a lean HDF5 look) at a fraction of
a full parse; anything else takes the full check. Either way its (lat, lon)
shape is compared with its box of the decomposition.

Both checks also place the tile (:mod:`ensio.io.scan.tileplace`): its
coordinates must be its window of the global grid (the untiled members'
:func:`~ensio.io.scan.consistency.check_coordinates`, on the tile's
window), time equal in every tile of every member, and NEMO-style tiles'
``DOMAIN_*`` attributes must give the tile's box, in every member.

A :class:`TileScan` lives as long as the ensemble-I/O object holding it: a
later read or write costs one ``stat`` per tile, and only tiles whose
identity changed (the model wrote them) are checked again.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ...errors import InputError
from ...layout.state import StateLayout
from ...layout.tiles import TileGeometry
from ...parallel.agree import ErrorNote, note_error, rebuild, root_call
from ..formats.open import open_member
from ..formats.store import VarInfo
from .consistency import check_coordinates, check_distinct, check_times
from .members import file_identity, read_whole
from .quickcheck import Template, make_template, quick_check
from .tileplace import DOMAIN_FLAG, check_domain, domain_attributes, tile_layouts

__all__ = ["TileScan", "check_tile", "tile_template"]

TileInfos = dict[str, VarInfo]
Times = np.ndarray | None


def _shape_check(path: Path, infos: Mapping[str, VarInfo], layout: StateLayout,
                 file_shape: tuple[int, int], index: int) -> TileInfos:  # fmt: skip
    """The state variables of one tile, checked: present, with the tile's shape."""
    out: TileInfos = {}
    for v in layout.variables:
        info = infos.get(v.name)
        if info is None:
            raise InputError(f"{path}: state variable '{v.name}' not found")
        want = (*v.shape[:-2], *file_shape)
        if info.shape != want:
            raise InputError(
                f"{path}: state variable '{v.name}' has shape {info.shape}, "
                f"tile {index} needs {want}"
            )
        out[v.name] = info
    return out


def _full(path: Path, layout: StateLayout, first: Callable[[TileInfos], object] | None = None,
          ) -> tuple[dict[str, VarInfo], str, bool, bool, Times]:  # fmt: skip
    """All variables of one tile through its store; format, capabilities, its time.

    ``layout``: the tile's (:func:`~ensio.io.scan.tileplace.tile_layouts`),
    whose coordinates are compared with the tile's here, after ``first``
    (the state variables' check: a tile of the wrong shape is named so).
    """
    with open_member(path) as store:
        kind = type(store)
        infos = dict(store.variables())
        if first is not None:
            first(infos)

        def read(name: str) -> np.ndarray | None:
            info = infos.get(name)
            return None if info is None else read_whole(store, info)

        times = check_coordinates(path, layout, read)
        return infos, kind.format_name, kind.raw_byte_ranges, kind.library_writes, times


def _raw_only(infos: TileInfos, raw_byte_ranges: bool) -> TileInfos:
    """Offsets only where the format allows byte-range I/O (else: library path)."""
    if raw_byte_ranges:
        return infos
    return {n: dataclasses.replace(i, raw_offset=None) for n, i in infos.items()}


def tile_template(path: Path, layout: StateLayout) -> Template | None:
    """Fully describe tile ``path``: the quick check's template for its tile index (or None).

    ``layout``: the tile's, so the template reads its coordinates too.
    """
    infos, fmt, raw, writes, _ = _full(path, layout)
    if not raw:
        return None
    return make_template(path, layout, infos, fmt, writes)


def check_tile(
    path: Path, layout: StateLayout, geometry: TileGeometry, index: int,
    template: Template | None, *, domain: bool = False,
) -> tuple[TileInfos, bool, Times]:  # fmt: skip
    """One tile file checked against its layout and its box; (state infos, quick?, time).

    ``layout`` is tile ``index``'s (:func:`~ensio.io.scan.tileplace.tile_layouts`):
    its coordinates are compared, by the quick check first (with a
    ``template``), else by the full check, whose messages name the file and
    the problem. With ``domain`` the tile's ``DOMAIN_*`` attributes must give
    its box.
    """
    shape = geometry.boxes[index].file_shape
    if domain:
        check_domain(path, index, domain_attributes(path), geometry)
    if template is not None:
        quick = quick_check(path, layout, template)
        if quick is not None:
            return _shape_check(path, quick[0], layout, shape, index), True, quick[1]
    infos, _, raw, _, times = _full(
        path, layout, lambda found: _shape_check(path, found, layout, shape, index))
    return _raw_only(_shape_check(path, infos, layout, shape, index), raw), False, times


class TileScan:
    """Collective: the validated state-variable descriptions of all N_e × P tiles.

    Parameters
    ----------
    paths : sequence of sequence of Path
        ``paths[m][t]``: tile t of member m.
    layout : StateLayout
        The global layout (:class:`~ensio.io.tiles.tiled.TiledEnsemble`).
    geometry : TileGeometry
        The decomposition (each tile's file shape).
    comm : MPI.Comm
        The ranks sharing the checks (file k = m·P + t goes to rank k mod size).

    Attributes
    ----------
    infos : list of list of dict
        ``infos[m][t]``: tile t of member m's state variables (raw offsets
        where a variable is one plain byte range, else ``raw_offset`` None).
    checked, quick, seconds
        This rank's share of the last :meth:`refresh` (the benchmark's
        per-file cost, as :class:`~ensio.io.scan.members.MemberScan` reports it).

    Raises
    ------
    InputError
        The same on every rank (the problem of the lowest tile in member-major
        order): a missing, corrupt or wrongly shaped tile, or one out of place
        (:mod:`ensio.io.scan.tileplace`).
    """

    def __init__(
        self, paths: Sequence[Sequence[Path]], layout: StateLayout, geometry: TileGeometry,
        comm: MPI.Comm,
    ) -> None:  # fmt: skip
        self.p = len(geometry.boxes)
        self.flat = [Path(x) for tiles in paths for x in tiles]
        self.layout, self.geometry, self.comm = layout, geometry, comm
        self._seen: dict[int, tuple[int, ...]] = {}
        self._infos: dict[int, TileInfos] = {}
        self._times: dict[int, Times] = {}
        self.checked, self.quick, self.seconds = 0, 0, 0.0
        # every tile's place in the grid; the same on every rank (and the same error)
        self.layouts = tile_layouts(layout, geometry, [str(x) for x in self.flat[: self.p]])
        self.templates: list[Template | None]
        self.templates, self.domain = root_call(comm, self._templates)
        self.infos: list[list[TileInfos]] = []
        self.refresh()

    def _templates(self) -> tuple[list[Template | None], bool]:
        """Rank 0: one template per tile index, from member 1 (None where none applies);
        whether the tiles carry ``DOMAIN_*`` attributes (member 1's first tile has them)."""
        out: list[Template | None] = []
        for path, layout in zip(self.flat[: self.p], self.layouts, strict=True):
            try:
                out.append(tile_template(path, layout))
            except Exception:  # a bad tile is reported by refresh, like any other
                out.append(None)
        try:
            domain = DOMAIN_FLAG in domain_attributes(self.flat[0])
        except Exception:  # reported by refresh
            domain = False
        return out, domain

    def _mine(self) -> range:
        return range(self.comm.rank, len(self.flat), self.comm.size)

    def invalidate(self) -> None:
        """Forget what was checked (the benchmark times the metadata pass this way)."""
        self._seen.clear()

    def refresh(self) -> list[list[TileInfos]]:
        """Collective: re-check the tiles whose identity changed; all tiles' infos, on all ranks."""
        changed: dict[int, tuple[TileInfos, Times]] = {}
        bad: tuple[int, ErrorNote] | None = None
        self.checked, self.quick, self.seconds = 0, 0, 0.0
        for k in self._mine():
            try:
                ident = file_identity(self.flat[k])
                if self._seen.get(k) != ident:
                    t0 = time.perf_counter()
                    t = k % self.p
                    infos, quick, times = check_tile(
                        self.flat[k], self.layouts[t], self.geometry, t, self.templates[t],
                        domain=self.domain)  # fmt: skip
                    self.seconds += time.perf_counter() - t0
                    self.checked += 1
                    self.quick += quick
                    changed[k] = infos, times
                    self._seen[k] = ident
            except Exception as exc:
                bad = (k, note_error(exc))
                self._seen.pop(k, None)
                break
        mine = {k: self._seen[k][:2] for k in self._mine() if k in self._seen}
        parts = self.comm.allgather((bad, changed, mine))
        failed = [b for b, _, _ in parts if b is not None]
        if failed:
            raise rebuild(min(failed, key=lambda b: b[0])[1])  # type: ignore[arg-type]
        inodes: dict[int, tuple[int, int]] = {}
        for _, part, ids in parts:
            for k, (infos, times) in part.items():
                self._infos[k], self._times[k] = infos, times
            inodes.update(ids)
        check_distinct(self.flat, inodes)
        geo = self.layout.geometry
        name = next((c.name for c in geo.checked if c.role == "time"), "time") if geo else "time"
        check_times(self.flat, [self._times[k] for k in range(len(self.flat))], name)
        n = len(self.flat) // self.p
        self.infos = [[self._infos[m * self.p + t] for t in range(self.p)] for m in range(n)]
        return self.infos

    def written(self, rewritten: Collection[tuple[int, int]] = ()) -> None:
        """After our own write: the tiles changed, the metadata of those written in place did not.

        Tiles patched as raw byte ranges keep their offsets under the files'
        new identity; tiles ``(m, t)`` in ``rewritten`` were replaced through
        the library (:mod:`ensio.io.tiles.tilerewrite`) and are checked again.
        """
        again = {m * self.p + t for m, t in rewritten}
        for k in self._mine():
            if k in again:
                self._seen.pop(k, None)
            elif k in self._seen:
                self._seen[k] = file_identity(self.flat[k])
