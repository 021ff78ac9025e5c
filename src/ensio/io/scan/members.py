"""Member-file metadata: the state layout and a validated scan of all members.

Why a separate metadata pass: opening a netCDF-4 file costs milliseconds, and
a bad member must be reported before the first byte moves (and before anything
is written). The scan spreads the N_e opens over all ranks, checks every file
against the layout, and shares the small per-file results (raw offsets and
on-disk dtypes), so the data pipeline itself only issues ``pread``/``pwrite``.

Every member is checked against one fully checked member, the template, at
a fraction of a full parse (:mod:`ensio.io.scan.quickcheck`): with many small
members the per-file cost of this pass, not the data, used to dominate.

The scan is an object (:class:`MemberScan`) that lives as long as the
ensemble-I/O object holding it: a repeated read or write (read then write of
one cycle, a benchmark's repeats) then costs one ``stat`` per file instead of
an open, and nothing is remembered between objects.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ...config.schema import ConfigError, EnsembleSection, IOSection
from ...errors import InputError
from ...layout.companions import attach_companions, companion_sources
from ...layout.state import StateLayout, VarMeta, build_layout, check_state_dtype
from ...parallel.agree import ErrorNote, note_error, rebuild, root_call
from ..formats.open import open_member
from ..formats.raw import raw_read
from ..formats.store import MemberStore, VarInfo
from .axisroles import axis_roles, open_grid
from .consistency import check_coordinates, check_distinct, check_times
from .quickcheck import Template, make_template, quick_check

__all__ = ["MemberMeta", "MemberScan", "check_member", "layout_from_member", "resolve_io_tasks",
           "root_layout"]


@dataclass(frozen=True)
class MemberMeta:
    """One member file as the data path sees it, checked against the layout.

    Attributes
    ----------
    infos : Mapping[str, VarInfo]
        State-variable name → its description in this file.
    raw_byte_ranges, library_writes : bool
        The capabilities of the file's format (class attributes of its
        :class:`~ensio.io.formats.store.MemberStore`).
    """

    infos: Mapping[str, VarInfo]
    raw_byte_ranges: bool
    library_writes: bool
    time: np.ndarray | None = None
    #: Accepted by the quick check (:mod:`ensio.io.scan.quickcheck`), not the full one.
    quick: bool = False
    #: The file's format as the check found it: reopening the file need not look again.
    store: type[MemberStore] | None = None

    def raw(self, name: str) -> bool:
        """Whether state variable ``name`` moves as a plain byte range (else: library path)."""
        return self.raw_byte_ranges and self.infos[name].raw_offset is not None

    @property
    def all_raw(self) -> bool:
        """Every state variable moves as a byte range (a write leaves the file in place)."""
        return all(self.raw(n) for n in self.infos)


def resolve_io_tasks(io: IOSection, n_members: int, n_mpi: int) -> int:
    """N_io: ``io.tasks`` if set (1 ≤ N_io ≤ N_mpi), else ``min(N_mpi, N_e)``."""
    n_io = io.tasks
    if n_io is None:
        return max(1, min(n_mpi, n_members))
    if n_io > n_mpi:
        raise ConfigError(f"io.tasks: N_io = {n_io} exceeds the number of ranks N_mpi = {n_mpi}")
    return n_io


def read_whole(store: MemberStore, info: VarInfo) -> np.ndarray:
    """All values of one variable as stored (native byte order), shaped.

    A variable with a raw byte range is ``pread`` straight from the file: the
    library path would open the file with the netCDF library, whose full
    metadata parse costs milliseconds per file (it dominated the metadata pass
    of small members). Values are the same either way.
    """
    if type(store).raw_byte_ranges and info.raw_offset is not None:
        fd = os.open(store.path, os.O_RDONLY)
        try:
            flat = raw_read(fd, info, 0, info.size, path=store.path)
        finally:
            os.close(fd)
        return flat.astype(info.dtype.newbyteorder("="), copy=False).reshape(info.shape)
    return store.read_elements(info.name, 0, info.size).reshape(info.shape)


def layout_from_member(ensemble: EnsembleSection, path: Path) -> StateLayout:
    """Build the state layout of the ``ensemble`` section from one member file (normally 1).

    The rows are the interior elements at the state's time level
    (``ensemble.halo``, ``time_level``; :mod:`ensio.layout.view`), with
    coordinates and masks from ``ensemble.grid`` if set; the write-back
    companions (``cyclic``, ``time_level.increment``, ``also``) are attached.
    """
    with open_member(path) as store, open_grid(ensemble, read_whole) as grid:
        infos = store.variables()
        metas = {n: VarMeta(n, i.dims, i.shape, i.dtype, i.encoding) for n, i in infos.items()}

        def read_var(name: str) -> np.ndarray:
            return read_whole(store, infos[name])

        roles = axis_roles(ensemble, infos, read_var, str(path))
        layout = build_layout(ensemble.variables, metas, read_var, ensemble.coordinates,
                              str(path), roles, grid)
        return attach_companions(layout, ensemble, metas, str(path))


def root_layout(ensemble: EnsembleSection, first: Path, comm: MPI.Comm) -> StateLayout:
    """Collective: rank 0 builds the layout from member file ``first`` and shares it."""
    return root_call(comm, lambda: layout_from_member(ensemble, first))


def check_member(
    path: Path, layout: StateLayout, template: Template | None = None
) -> MemberMeta:
    """Open one member and check it against the layout: state variables, coordinates.

    The coordinate variables (:func:`~ensio.io.scan.consistency.check_coordinates`)
    are compared with the first member's, so a member with inverted latitudes
    is refused by name. With a ``template`` (:mod:`ensio.io.scan.quickcheck`) a
    member of the template's structure is checked without a full metadata
    parse; anything else takes the full check, whose messages name the problem.
    """
    quick = None if template is None else quick_member(path, layout, template)
    return quick if quick is not None else _full_check(path, layout)[0]


def quick_member(path: Path, layout: StateLayout, template: Template) -> MemberMeta | None:
    """The quick check of :mod:`ensio.io.scan.quickcheck`; None: take the full check.

    A layout with ``also`` variables takes the full check: the quick one
    describes the state and coordinate variables only.
    """
    if companion_sources(layout):
        return None
    quick = quick_check(path, layout, template)
    if quick is None:
        return None
    infos, times = quick
    state = _check_variables(path, layout, infos)
    return MemberMeta(state, True, template.library_writes, time=times, quick=True,
                      store=template.store)


def _full_check(path: Path, layout: StateLayout) -> tuple[MemberMeta, dict[str, VarInfo], str]:
    """:func:`check_member` without a template; also all variable descriptions and the format."""
    with open_member(path) as store:
        fmt = type(store).format_name
        infos = dict(store.variables())
        caps = (type(store).raw_byte_ranges, type(store).library_writes)
        out = _check_variables(path, layout, infos)

        def read(name: str) -> np.ndarray | None:
            info = infos.get(name)
            return None if info is None else read_whole(store, info)

        times = check_coordinates(path, layout, read)
    return MemberMeta(out, *caps, time=times, store=type(store)), infos, fmt


def member_template(path: Path, layout: StateLayout) -> tuple[MemberMeta, Template | None]:
    """Fully check member ``path``; it is the template of the quick check (if that applies)."""
    meta, infos, fmt = _full_check(path, layout)
    if not meta.raw_byte_ranges:  # the quick check reads coordinates as byte ranges
        return meta, None
    return meta, make_template(path, layout, infos, fmt, meta.library_writes)


def _check_variables(
    path: Path, layout: StateLayout, infos: Mapping[str, VarInfo]
) -> dict[str, VarInfo]:
    """The state variables of one member, checked against the layout (dims, shape, dtype)."""
    out: dict[str, VarInfo] = {}
    for v in layout.variables:
        info = infos.get(v.name)
        if info is None:
            raise InputError(f"{path}: state variable '{v.name}' not found")
        dims = v.dims if v.view is None else v.view.file_dims  # as the file names them
        if info.dims != dims or info.shape != v.shape:
            raise InputError(
                f"{path}: variable '{v.name}' has dims {_dims(info.dims, info.shape)}, "
                f"expected {_dims(dims, v.shape)} as in the first member"
            )
        if info.dtype.newbyteorder("=") != v.dtype:
            raise InputError(
                f"{path}: variable '{v.name}' has dtype {info.dtype.newbyteorder('=').name}, "
                f"expected {v.dtype.name} as in the first member"
            )
        check_state_dtype(VarMeta(v.name, info.dims, info.shape, info.dtype, info.encoding),
                          str(path))
        out[v.name] = info
    for name, source in companion_sources(layout).items():  # ``also``: written, not read
        info = infos.get(name)
        if info is None:
            raise InputError(f"{path}: variable '{name}' (the also of '{source}') not found")
        if info.shape != layout.variable(source).shape:
            raise InputError(
                f"{path}: variable '{name}' (the also of '{source}') has shape {info.shape}, "
                f"expected {layout.variable(source).shape} as '{source}'"
            )
        out[name] = info
    return out


def file_identity(path: Path) -> tuple[int, ...]:
    """What changes when a file is replaced or written: device, inode, size, times."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: member file not found") from None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class MemberScan:
    """Collective: the validated metadata of every member file, kept current.

    Rank r checks members r, r + N, ... (N = ``comm.size``) and remembers the
    identity (:func:`file_identity`) of each file when it checked it;
    :meth:`refresh` re-opens only the files whose identity changed since.

    Parameters
    ----------
    paths : sequence of Path
        The member files, in matrix order.
    layout : StateLayout
        What every member must match.
    comm : MPI.Comm
        The ranks sharing the opens.
    copies_of : sequence of MemberMeta, optional
        The files are byte copies, just made, of files a scan checked, with this
        metadata (a run's analysis copies, :func:`ensio.io.products.products.
        write_member_copies`): taken as it is, no copy is opened again (a plain
        HDF5 restart costs ~15 ms of Python per full check). Their identity is
        recorded now, so a later :meth:`refresh` checks only what changed since.

    Raises
    ------
    InputError
        The same on every rank (the lowest member's problem) if a file is
        missing, not netCDF, or does not match the layout.
    """

    def __init__(self, paths: Sequence[Path], layout: StateLayout, comm: MPI.Comm,
                 copies_of: Sequence[MemberMeta] | None = None) -> None:
        self.paths = list(paths)
        self.layout = layout
        self.comm = comm
        self._seen: dict[int, tuple[int, ...]] = {}
        self.metas: list[MemberMeta] = []
        #: This rank's share of the last :meth:`refresh`: files checked, quickly, seconds.
        self.checked, self.quick, self.seconds = 0, 0, 0.0
        self.template: Template | None = None
        if copies_of is not None:
            if len(copies_of) != len(self.paths):
                raise ValueError(f"{len(copies_of)} metadata for {len(self.paths)} copies")
            self.metas = list(copies_of)
            self._seen = {m: file_identity(self.paths[m]) for m in self._mine()}
            return
        first = root_call(comm, self._first) if self.paths else None
        self.refresh(first)

    def _first(self) -> tuple[tuple[int, ...], MemberMeta, Template | None] | None:
        """Rank 0: member 1, fully checked, and the quick check's template; None if it is bad.

        A bad member 1 is reported by :meth:`refresh` like any other member.
        """
        try:
            ident = file_identity(self.paths[0])
            return (ident, *member_template(self.paths[0], self.layout))
        except Exception:
            return None

    def _mine(self) -> range:
        return range(self.comm.rank, len(self.paths), self.comm.size)

    def invalidate(self) -> None:
        """Forget what was checked: the next :meth:`refresh` checks every member again.

        What a run sees when the model has written new member files; the
        benchmark measures the metadata pass this way.
        """
        self._seen.clear()

    def _check(self, m: int) -> MemberMeta:
        t0 = time.perf_counter()
        meta = check_member(self.paths[m], self.layout, self.template)
        self.seconds += time.perf_counter() - t0
        self.checked += 1
        self.quick += meta.quick
        return meta

    def refresh(
        self,
        first: tuple[tuple[int, ...], MemberMeta, Template | None] | None = None,
        *,
        before: Callable[[], bool] | None = None,
    ) -> list[MemberMeta]:
        """Collective: re-check the members that changed; the metadata of all, on all ranks.

        Raises the problem of the lowest-numbered bad member (the same on
        every rank), and an error naming both paths if two members are one
        file (:func:`~ensio.io.scan.consistency.check_distinct`). ``first``: member
        1 as checked by :meth:`_first` (construction only).

        ``before`` runs on rank 0 ahead of its checks (journal recovery); its
        error is raised on every rank, and if it returns True (files were
        restored, possibly while other ranks looked at them) every rank checks
        again. It shares this pass's one collective: on a loaded machine each
        synchronisation of the ranks costs about a scheduler time slice.
        """
        changed: dict[int, MemberMeta] = {}
        bad: tuple[int, ErrorNote] | None = None
        again = False
        self.checked, self.quick, self.seconds = 0, 0, 0.0
        if first is not None:
            ident, meta, self.template = first
            if 0 in self._mine():
                self._seen[0], changed[0] = ident, meta
        if before is not None and self.comm.rank == 0:
            try:
                again = bool(before())
            except Exception as exc:
                bad = (-1, note_error(exc))  # before any member's problem
        for m in self._mine() if bad is None else ():
            try:
                ident = file_identity(self.paths[m])
                if self._seen.get(m) != ident:
                    changed[m] = self._check(m)
                    self._seen[m] = ident
            except Exception as exc:
                bad = (m, note_error(exc))
                self._seen.pop(m, None)
                break
        # one collective for errors and results: a metadata pass costs one round trip
        mine = {m: self._seen[m][:2] for m in self._mine() if m in self._seen}
        parts = self.comm.allgather((bad, changed, mine, again))
        if any(p[3] for p in parts):  # files were restored: what anyone found is stale
            self.invalidate()
            return self.refresh()
        failed = [b for b, _, _, _ in parts if b is not None]
        if failed:
            raise rebuild(min(failed, key=lambda b: b[0])[1])  # type: ignore[arg-type]
        merged = dict(enumerate(self.metas))
        inodes: dict[int, tuple[int, int]] = {}
        for _, part, ids, _ in parts:
            merged.update(part)
            inodes.update(ids)
        check_distinct(self.paths, inodes)
        self.metas = [merged[m] for m in range(len(self.paths))]
        geo = self.layout.geometry
        name = next((c.name for c in geo.checked if c.role == "time"), "time") if geo else "time"
        check_times(self.paths, [meta.time for meta in self.metas], name)
        return self.metas

    def written(self) -> None:
        """After our own in-place write: the files changed, their metadata did not.

        Only the bytes of byte-range state variables were rewritten, so the
        metadata stays valid under the files' new identity. Files with
        library-path variables were replaced by a rewritten copy: checked
        again by the next :meth:`refresh`.
        """
        for m in self._mine():
            if self.metas[m].all_raw:
                self._seen[m] = file_identity(self.paths[m])
            else:
                self._seen.pop(m, None)


def _dims(dims: tuple[str, ...], shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(f"{d}={n}" for d, n in zip(dims, shape, strict=True)) + ")"
