"""Member-file metadata: the state layout and a validated scan of all members.

Why a separate metadata pass: opening a netCDF-4 file costs milliseconds, and
a bad member must be reported before the first byte moves (and before anything
is written). The scan spreads the N_e opens over all ranks, checks every file
against the layout, and shares the small per-file results (raw offsets and
on-disk dtypes), so the data pipeline itself only issues ``pread``/``pwrite``.

The scan is an object (:class:`MemberScan`) that lives as long as the
ensemble-I/O object holding it: a repeated read or write (read then write of
one cycle, a benchmark's repeats) then costs one ``stat`` per file instead of
an open, and nothing is remembered between objects.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ..config.schema import ConfigError, EnsembleSection, IOSection
from ..errors import InputError
from ..layout.state import StateLayout, VarMeta, build_layout, check_state_dtype
from ..parallel.agree import ErrorNote, note_error, rebuild, root_call
from .consistency import check_coordinates, check_distinct, check_times
from .open import open_member
from .store import VarInfo

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
        :class:`~ensio.io.store.MemberStore`).
    """

    infos: Mapping[str, VarInfo]
    raw_byte_ranges: bool
    library_writes: bool
    time: np.ndarray | None = None

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


def layout_from_member(ensemble: EnsembleSection, path: Path) -> StateLayout:
    """Build the state layout of the ``ensemble`` section from one member file (normally 1)."""
    with open_member(path) as store:
        infos = store.variables()
        metas = {n: VarMeta(n, i.dims, i.shape, i.dtype, i.encoding) for n, i in infos.items()}

        def read_var(name: str) -> np.ndarray:
            info = infos[name]
            return store.read_elements(name, 0, info.size).reshape(info.shape)

        return build_layout(ensemble.variables, metas, read_var, ensemble.coordinates, str(path))


def root_layout(ensemble: EnsembleSection, first: Path, comm: MPI.Comm) -> StateLayout:
    """Collective: rank 0 builds the layout from member file ``first`` and shares it."""
    return root_call(comm, lambda: layout_from_member(ensemble, first))


def check_member(path: Path, layout: StateLayout) -> MemberMeta:
    """Open one member and check it against the layout: state variables, coordinates.

    The coordinate variables (:func:`~ensio.io.consistency.check_coordinates`)
    are compared with the first member's, so a member with inverted latitudes
    is refused by name.
    """
    with open_member(path) as store:
        infos = store.variables()
        caps = (type(store).raw_byte_ranges, type(store).library_writes)
        out = _check_variables(path, layout, infos)

        def read(name: str) -> np.ndarray | None:
            info = infos.get(name)
            if info is None:
                return None
            return store.read_elements(name, 0, info.size).reshape(info.shape)

        time = check_coordinates(path, layout, read)
    return MemberMeta(out, *caps, time=time)


def _check_variables(
    path: Path, layout: StateLayout, infos: Mapping[str, VarInfo]
) -> dict[str, VarInfo]:
    """The state variables of one member, checked against the layout (dims, shape, dtype)."""
    out: dict[str, VarInfo] = {}
    for v in layout.variables:
        info = infos.get(v.name)
        if info is None:
            raise InputError(f"{path}: state variable '{v.name}' not found")
        if info.dims != v.dims or info.shape != v.shape:
            raise InputError(
                f"{path}: variable '{v.name}' has dims {_dims(info.dims, info.shape)}, "
                f"expected {_dims(v.dims, v.shape)} as in the first member"
            )
        if info.dtype.newbyteorder("=") != v.dtype:
            raise InputError(
                f"{path}: variable '{v.name}' has dtype {info.dtype.newbyteorder('=').name}, "
                f"expected {v.dtype.name} as in the first member"
            )
        check_state_dtype(VarMeta(v.name, info.dims, info.shape, info.dtype, info.encoding),
                          str(path))
        out[v.name] = info
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

    Raises
    ------
    InputError
        The same on every rank (the lowest member's problem) if a file is
        missing, not netCDF, or does not match the layout.
    """

    def __init__(self, paths: Sequence[Path], layout: StateLayout, comm: MPI.Comm) -> None:
        self.paths = list(paths)
        self.layout = layout
        self.comm = comm
        self._seen: dict[int, tuple[int, ...]] = {}
        self.metas: list[MemberMeta] = []
        self.refresh()

    def _mine(self) -> range:
        return range(self.comm.rank, len(self.paths), self.comm.size)

    def refresh(self) -> list[MemberMeta]:
        """Collective: re-check the members that changed; the metadata of all, on all ranks.

        Raises the problem of the lowest-numbered bad member (the same on
        every rank), and an error naming both paths if two members are one
        file (:func:`~ensio.io.consistency.check_distinct`).
        """
        changed: dict[int, MemberMeta] = {}
        bad: tuple[int, ErrorNote] | None = None
        for m in self._mine():
            try:
                ident = file_identity(self.paths[m])
                if self._seen.get(m) != ident:
                    changed[m] = check_member(self.paths[m], self.layout)
                    self._seen[m] = ident
            except Exception as exc:
                bad = (m, note_error(exc))
                self._seen.pop(m, None)
                break
        failed = [b for b in self.comm.allgather(bad) if b is not None]
        if failed:
            raise rebuild(min(failed, key=lambda b: b[0])[1])  # type: ignore[arg-type]
        merged = dict(enumerate(self.metas))
        inodes: dict[int, tuple[int, int]] = {}
        mine = {m: self._seen[m][:2] for m in self._mine()}
        for part, ids in self.comm.allgather((changed, mine)):
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
