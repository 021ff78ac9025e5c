"""Tiled members: each member is P tile files (``{tile}`` in ``ensemble.members``).

The ensemble matrix stays global: row ``offset + flat`` of a variable is its
element ``flat`` in C order of the *global* shape ``(..., ny, nx)``. A tile
contributes the runs of its interior (:meth:`TileBox.runs
<ensio.layout.tiles.TileBox.runs>`, one per latitude line and level); its halo
is read past and never written. Reading a member reads its P tiles' interiors
into the right rows, so a tiled case gives exactly the matrix of the
equivalent single-file case; writing is the reverse, in place, with the prior
bytes of every run journaled first (:class:`~ensio.io.txn.undolog.UndoLog`), as
``io.mode: files`` does, so an interrupted write is undone by ``ensio recover``.

Everything is validated before the first byte is written: every tile file
exists, has every state variable with the tile's (y, x) shape and the same
leading dims, (from NEMO attributes) the tiles cover the grid exactly once,
and every tile of every member sits at its place in the grid (the shared
scan, :mod:`ensio.io.scan.tileplace`, in every I/O mode).

:class:`TiledEnsemble` reads and writes any row range on the calling
process; :class:`~ensio.io.modes.tiledio.TiledEnsembleIO` is its collective form
(every rank its own rows), which ``ensio analyse`` opens for a ``{tile}``
pattern. The group shuffle (issue 13, item 2) is to reuse the geometry of
:mod:`ensio.layout.tiles`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

import netCDF4
import numpy as np
from mpi4py import MPI

from ...config.schema import Config, EnsembleSection
from ...errors import InputError
from ...layout.state import StateLayout, VarMeta, build_layout
from ...layout.tiles import TileGeometry, declared_geometry, nemo_box
from ...parallel.agree import ErrorNote, guard, rebuild
from ..formats.open import open_member
from ..formats.store import VarInfo
from ..scan.memberfiles import file_exists, tile_count
from ..scan.tilescan import TileScan
from ..txn import journal as journal_mod
from .tilefile import TileRuns, plan_runs, read_tile, write_tile
from .tileproducts import check_product_patterns
from .tileread import read_member_rows
from .tilerewrite import library_tiles, write_library_tiles

__all__ = [
    "TiledEnsemble",
    "check_tiled_run",
    "geometry_from_attributes",
    "global_layout",
    "tile_geometry",
]


def _tile_yx(path: Path, info: VarInfo) -> tuple[int, int]:
    if len(info.shape) < 2:
        raise InputError(f"{path}: state variable '{info.name}' has no (lat, lon) dims to tile")
    return info.shape[-2], info.shape[-1]


def _candidates(sizes: list[int], halo: int) -> range:
    """Global sizes that file sizes ``sizes`` of one block row/column could come from."""
    total = sum(sizes)
    return range(max(1, total - 2 * halo * len(sizes)), total + 1)


def _declared(
    ens: EnsembleSection, shapes: list[tuple[int, int]], paths: list[Path]
) -> TileGeometry:
    """The declared decomposition whose tile shapes match the files (grid inferred)."""
    spec = ens.tiles
    assert spec is not None
    px, py = spec.layout
    xs = [shapes[t][1] for t in range(px)]
    ys = [shapes[t * px][0] for t in range(py)]
    for ny in _candidates(ys, spec.halo):
        for nx in _candidates(xs, spec.halo):
            if px > nx or py > ny:
                continue
            geo = declared_geometry((ny, nx), spec.count, spec.layout, spec.halo)
            first = [geo.boxes[t].file_shape for t in (*range(px), *range(0, spec.count, px))]
            if first == [shapes[t] for t in (*range(px), *range(0, spec.count, px))]:
                for b, shape, path in zip(geo.boxes, shapes, paths, strict=True):
                    if b.file_shape != shape:
                        raise InputError(
                            f"{path}: tile {b.index} (lat, lon) shape {shape} is not "
                            f"{b.file_shape} of ensemble.tiles on a {ny}x{nx} grid"
                        )
                return geo
    raise InputError(
        f"{paths[0]}: tile (lat, lon) shapes {shapes[:px]}... fit no {px}x{py} block "
        f"decomposition with ensemble.tiles.halo {spec.halo}"
    )


def _from_attributes(paths: list[Path]) -> TileGeometry:
    attrs = []
    for path in paths:
        with netCDF4.Dataset(path) as ds:
            attrs.append({k: ds.getncattr(k) for k in ds.ncattrs()})
    return geometry_from_attributes(attrs, [str(p) for p in paths])


def geometry_from_attributes(attrs: list[dict[str, object]], sources: list[str]) -> TileGeometry:
    """The decomposition from the NEMO ``DOMAIN_*`` attributes of one member's P tiles.

    ``attrs[t]`` are tile t's global attributes, ``sources[t]`` its file name
    for messages (the shuffle mode gathers them from the ranks that hold the
    tiles on their local disks).
    """
    boxes, grids = [], set()
    for t, (at, source) in enumerate(zip(attrs, sources, strict=True)):
        box, total, grid = nemo_box(at, t, source)
        if total != len(attrs):
            raise InputError(
                f"{source}: DOMAIN_number_total {total} is not the {len(attrs)} tiles of the member"
            )
        boxes.append(box)
        grids.add(grid)
    if len(grids) != 1:
        raise InputError(f"{sources[-1]}: DOMAIN_size_global differs between tiles: "
                         f"{sorted(grids)}")  # fmt: skip
    geo = TileGeometry(grids.pop(), tuple(boxes))
    geo.check(sources)
    return geo


def check_tiled_run(config: Config) -> None:
    """What an analysis of tiled members cannot do yet: refuse it before reading.

    Tiled members are written one file per tile, and so are their copies
    (``output.members`` when ``io.in_place`` is false) and products
    (``output.mean`` / ``spread``): those names need ``{tile}`` exactly when
    the members' do (:func:`~ensio.io.tiles.tileproducts.check_product_patterns`).
    What a mode cannot do besides is its own
    :meth:`~ensio.io.modes.base.EnsembleIO.check_run`.
    """
    out = config.output
    named = {"members": None if config.io.in_place else out.members, "mean": out.mean,
             "spread": out.spread}  # fmt: skip
    check_product_patterns(named, config.ensemble.tiled)


def tile_geometry(
    ens: EnsembleSection, paths: list[Path], shapes: list[tuple[int, int]],
    attrs: list[dict[str, object]] | None = None,
) -> TileGeometry:  # fmt: skip
    """The decomposition of one member's tiles ``paths`` (file (y, x) ``shapes``).

    ``attrs`` (each tile's global attributes) when they are already read;
    else the NEMO attributes are read from ``paths``.
    """
    if ens.tiles is not None:
        geo = _declared(ens, shapes, paths)
    elif attrs is not None:
        geo = geometry_from_attributes(attrs, [str(p) for p in paths])
    else:
        geo = _from_attributes(paths)
    for b, shape, path in zip(geo.boxes, shapes, paths, strict=True):
        if b.file_shape != shape:
            raise InputError(
                f"{path}: tile (lat, lon) shape {shape} is not {b.file_shape} of its "
                "DOMAIN_* attributes"
            )
    return geo


def global_layout(
    ens: EnsembleSection,
    geometry: TileGeometry,
    infos: dict[str, VarInfo],
    read_tile_var: Callable[[int, str], np.ndarray],
    source: str,
) -> StateLayout:
    """The layout of the virtual global member, coordinates assembled from member 1's tiles.

    ``infos`` are tile 0's variables; ``read_tile_var(t, name)`` gives tile
    t's whole variable (only coordinates are asked for). A variable whose
    dims include the state's (lat, lon) dims gets the global size along
    them; its values are the tiles' interiors put together.
    """
    names = [v.name for v in ens.variables]
    state = infos[names[0]]
    ydim, xdim = state.dims[-2], state.dims[-1]
    grid = dict(zip((ydim, xdim), geometry.grid, strict=True))
    metas = {
        name: VarMeta(
            name,
            info.dims,
            tuple(grid.get(d, n) for d, n in zip(info.dims, info.shape, strict=True)),
            info.dtype,
            info.encoding,
        )
        for name, info in infos.items()
    }

    def read_var(name: str) -> np.ndarray:
        meta = metas[name]
        out = None
        for box in geometry.boxes:
            part = read_tile_var(box.index, name)
            if out is None:
                out = np.empty(meta.shape, dtype=part.dtype)
            iy, ix = box.interior()
            src = tuple({ydim: iy, xdim: ix}.get(d, slice(None)) for d in meta.dims)
            dst = tuple(
                {ydim: slice(box.y0, box.y1), xdim: slice(box.x0, box.x1)}.get(d, slice(None))
                for d in meta.dims
            )
            out[dst] = part[src]
        assert out is not None
        return out

    return build_layout(ens.variables, metas, read_var, ens.coordinates, source)


class TiledEnsemble:
    """The N_e × P tile files of a tiled ensemble, validated once.

    Parameters
    ----------
    ens : EnsembleSection
        With ``{tile}`` in ``members``; a mask variable is tiled like the state.
    base : Path
        Directory relative patterns are resolved against.

    Attributes
    ----------
    paths : list of list of Path
        ``paths[m][t]``: tile t of the m-th member (matrix order).
    geometry : TileGeometry
    layout : StateLayout
        The global layout (no coordinates: ``geometry`` is ``None``).

    Raises
    ------
    InputError
        A missing tile, a tile of the wrong shape, a bad decomposition; the
        message names the file and the variable or attribute.
    """

    def __init__(self, ens: EnsembleSection, base: Path, *, check_tiles: bool = True) -> None:
        if not ens.tiled:
            raise InputError(f"ensemble.members: pattern {ens.members!r} has no {{tile}}")
        p = tile_count(ens, base)
        self.paths = [[ens.tile_path(m, t, base) for t in range(p)] for m in ens.numbers]
        for tiles in self.paths:
            for path in tiles:
                file_exists(path)
        self.names = [v.name for v in ens.variables]
        first = [self._infos(path) for path in self.paths[0]]
        shapes = [
            _tile_yx(path, infos[self.names[0]])
            for path, infos in zip(self.paths[0], first, strict=True)
        ]
        self.geometry = tile_geometry(ens, self.paths[0], shapes)
        self.layout = self._global_layout(ens, first[0])
        self._runs = self._plan()
        if not check_tiles:  # the caller checks them (:class:`~ensio.io.scan.tilescan.TileScan`)
            return
        # the shared scan, on this process: shapes, each tile's place in the grid, distinct files
        TileScan(self.paths, self.layout, self.geometry, MPI.COMM_SELF)

    def with_paths(self, paths: list[list[Path]]) -> TiledEnsemble:
        """The same ensemble (geometry, layout, runs) in other files, e.g. byte copies."""
        other = copy.copy(self)
        other.paths = paths
        return other

    def _infos(self, path: Path) -> dict[str, VarInfo]:
        with open_member(path) as store:
            infos = dict(store.variables())
        for name in self.names:
            if name not in infos:
                raise InputError(f"{path}: state variable '{name}' not found")
        return infos

    def _global_layout(self, ens: EnsembleSection, infos: dict[str, VarInfo]) -> StateLayout:
        """The layout of the virtual global member, coordinates from member 1's tiles."""

        def read_tile_var(t: int, name: str) -> np.ndarray:
            with open_member(self.paths[0][t]) as store:
                info = store.variables()[name]
                return np.asarray(store.read_elements(name, 0, info.size)).reshape(info.shape)

        return global_layout(ens, self.geometry, infos, read_tile_var, str(self.paths[0][0]))

    def _plan(self) -> list[list[TileRuns]]:
        return plan_runs(self.geometry, self.layout)

    @property
    def runs(self) -> list[list[TileRuns]]:
        """Per tile, per state variable: the interior's runs."""
        return self._runs

    @property
    def n_members(self) -> int:
        return len(self.paths)

    def read(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Rows ``[lo, hi)`` of the ensemble matrix, shape (N_e, hi - lo).

        Physical values, missing ones NaN; only the tiles (and, in each, only
        the element range) that hold those rows are read, each opened
        through the netCDF library (the collective reader,
        :class:`~ensio.io.modes.tiledio.TiledEnsembleIO`, reads raw byte ranges
        from offsets it checked once: :meth:`read_into`).
        """
        hi = self.layout.n_rows if hi is None else hi
        out = np.empty((self.n_members, hi - lo), dtype=np.float64)
        for m, tiles in enumerate(self.paths):
            for path, runs in zip(tiles, self._runs, strict=True):
                rows, values = read_tile(path, self.names, runs, lo, hi)
                out[m, rows - lo] = values
        return out

    def read_into(
        self, out: np.ndarray, lo: int, infos: Sequence[Sequence[Mapping[str, VarInfo]]]
    ) -> bool:
        """Rows ``[lo, lo + out.shape[1])`` of every member into ``out`` (N_e, n), float64.

        ``infos[m][t]``: tile t of member m's state variables as checked
        (:class:`~ensio.io.scan.tilescan.TileScan`): byte-range variables are
        ``pread`` into ``out`` directly (:mod:`ensio.io.tiles.tileread`), the others
        read through the library. Returns False if every value is known finite.
        """
        maybe_nan = False
        for m, tiles in enumerate(self.paths):
            maybe_nan |= read_member_rows(tiles, infos[m], self._runs, self.layout, lo, out[m])
        return maybe_nan

    def tile_infos(self) -> list[list[dict[str, VarInfo]]]:
        """``[m][t]``: each tile's state variables, every tile opened (one-process use)."""
        return [[self._infos(path) for path in tiles] for tiles in self.paths]

    def write_all(
        self, comm: MPI.Comm, data: np.ndarray, lo: int, undo: journal_mod.UndoLog | None,
        fsync: bool, infos: Sequence[Sequence[Mapping[str, VarInfo]]],
    ) -> tuple[ErrorNote, int]:  # fmt: skip
        """Collective: rows ``[lo, lo + data.shape[1])`` into every tile, whatever its storage.

        Tiles whose state variables are all raw byte ranges are patched in
        place by every rank (:meth:`write_rows`); the others are rewritten
        whole by one owner each (:mod:`ensio.io.tiles.tilerewrite`). Returns this
        rank's first error (for the caller's agreement) and its clipped values.
        """
        lib = library_tiles(infos, self.names)
        clips = [0]

        def raw() -> None:
            clips[0] = self.write_rows(data, lo, undo, fsync, infos, skip=set(lib))

        note = guard(raw)
        lib_note, lib_clips = write_library_tiles(comm, self.paths, self.names, self._runs, lib,
                                                  data, lo, undo, fsync)  # fmt: skip
        return note or lib_note, clips[0] + lib_clips

    def write(self, data: np.ndarray, *, journal: bool = True, fsync: bool = False) -> int:
        """Write the analysis ``data`` (N_e, N_x) into every tile's interior, in place.

        The one-process form of :meth:`write_rows`, journaled and committed
        (or rolled back on error) here. Returns the number of values clipped
        by packing.
        """
        if data.shape != (self.n_members, self.layout.n_rows):
            raise ValueError(
                f"data shape {data.shape} is not ({self.n_members}, {self.layout.n_rows})"
            )
        infos = self.tile_infos()
        root = journal_mod.journal_root(self.paths[0][0])
        journal_mod.recover(root)
        undo = journal_mod.UndoLog.create(root, 0, fsync=fsync) if journal else None
        try:
            note, clips = self.write_all(MPI.COMM_SELF, data, 0, undo, fsync, infos)
            if note is not None:
                raise rebuild(note)
        except BaseException:
            if undo is not None:
                undo.close()
                journal_mod.abort(root, fsync=fsync)
            raise
        if undo is not None:
            undo.close()
            journal_mod.commit(root, fsync=fsync)
        return clips

    def write_rows(
        self, data: np.ndarray, lo: int, undo: journal_mod.UndoLog | None, fsync: bool,
        infos: Sequence[Sequence[Mapping[str, VarInfo]]] | None = None,
        skip: Collection[tuple[int, int]] = (),
    ) -> int:  # fmt: skip
        """Write rows ``[lo, lo + data.shape[1])`` of every member into the tiles' interiors.

        Tiles ``(m, t)`` in ``skip`` are left alone (written by the library path).

        Non-finite values keep the prior bytes (inactive points), as in
        ``files`` mode; the prior bytes of every run written are saved to
        ``undo`` first. Only bytes of interior points in the row range are
        touched, so ranks with disjoint row ranges can write the same tile
        concurrently. ``infos[m][t]``: the tiles' checked state variables (else
        each tile is opened for its offsets). Returns the number of values
        clipped by packing.
        """
        hi = lo + data.shape[1]
        clips = 0
        for m, tiles in enumerate(self.paths):
            for t, (path, runs) in enumerate(zip(tiles, self._runs, strict=True)):
                if (m, t) in skip:
                    continue
                clips += write_tile(path, self.names, runs, (lo, hi),
                                    lambda rows, m=m: data[m, rows - lo], undo, fsync,
                                    None if infos is None else infos[m][t])  # fmt: skip
        return clips
