"""Member-file metadata: the state layout and a validated scan of all members.

Why a separate metadata pass: opening a netCDF-4 file costs milliseconds, and
a bad member must be reported before the first byte moves (and before anything
is written). The scan spreads the N_e opens over all ranks, checks every file
against the layout, and shares the small per-file results (raw offsets and
on-disk dtypes), so the data pipeline itself only issues ``pread``/``pwrite``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ..config.schema import Config, ConfigError, Coordinates, VariableSpec
from ..errors import InputError
from ..layout.state import StateLayout, VarMeta, build_layout
from ..parallel.agree import ErrorNote, note_error, raise_if_any, root_call
from .open import open_member
from .store import VarInfo

__all__ = ["FileMeta", "layout_from_member", "resolve_io_tasks", "scan_members"]

#: Per member: state-variable name → its VarInfo in that file.
FileMeta = dict[str, VarInfo]


def resolve_io_tasks(config: Config, n_mpi: int) -> int:
    """N_io: ``io.tasks`` if set (1 ≤ N_io ≤ N_mpi), else ``min(N_mpi, N_e)``."""
    n_io = config.io.tasks
    if n_io is None:
        return max(1, min(n_mpi, config.ensemble.size))
    if n_io > n_mpi:
        raise ConfigError(f"io.tasks: N_io = {n_io} exceeds the number of ranks N_mpi = {n_mpi}")
    return n_io


def layout_from_member(config: Config, path: Path) -> StateLayout:
    """Build the state layout from one member file (normally member 1)."""
    with open_member(path) as store:
        infos = store.variables()
        metas = {n: VarMeta(n, i.dims, i.shape, i.dtype) for n, i in infos.items()}

        def read_var(name: str) -> np.ndarray:
            info = infos[name]
            return store.read_elements(name, 0, info.size).reshape(info.shape)

        return build_layout(
            config.ensemble.variables, metas, read_var, config.ensemble.coordinates, str(path)
        )


def check_member(path: Path, layout: StateLayout) -> FileMeta:
    """Open one member and check its state variables against the layout."""
    with open_member(path) as store:
        infos = store.variables()
    out: FileMeta = {}
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
        out[v.name] = info
    return out


#: Validated metadata by path, with the file identity and the layout signature
#: it was checked against. A repeated scan (read then write of one cycle, a
#: benchmark's repeats) then costs one ``stat`` per file instead of an open.
_CACHE: dict[Path, tuple[tuple[int, ...], tuple, FileMeta]] = {}
#: Layouts built by this process, by member-1 path and identity.
_LAYOUTS: dict[tuple, StateLayout] = {}


def _identity(path: Path) -> tuple[int, ...]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: member file not found") from None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _signature(layout: StateLayout) -> tuple:
    return tuple((v.name, v.dims, v.shape, v.dtype.str) for v in layout.variables)


def _checked(path: Path, layout: StateLayout) -> FileMeta:
    ident, sig = _identity(path), _signature(layout)
    hit = _CACHE.get(path)
    if hit is not None and hit[:2] == (ident, sig):
        return hit[2]
    meta = check_member(path, layout)
    _CACHE[path] = (ident, sig, meta)
    return meta


def remember_written(paths: Sequence[Path], metas: Sequence[FileMeta], comm: MPI.Comm) -> None:
    """After our own raw in-place writes: the files changed, their metadata did not.

    Only the bytes of contiguous state variables were rewritten, so the cached
    metadata stays valid under the files' new identity. Files that had
    library-path variables were replaced by a rewritten copy: not refreshed.
    """
    for m in range(comm.rank, len(paths), comm.size):
        if not all(i.raw_offset is not None for i in metas[m].values()):
            continue
        ident = _identity(paths[m])
        hit = _CACHE.get(paths[m])
        if hit is not None:
            _CACHE[paths[m]] = (ident, hit[1], hit[2])
        for key in [k for k in _LAYOUTS if k[0] == paths[m]]:
            layout = _LAYOUTS.pop(key)
            state = {v.name for v in layout.variables}
            if not state & (_mask_names(key[2]) | _coord_names(key[3])):
                _LAYOUTS[(key[0], ident, *key[2:])] = layout


def _mask_names(specs: Sequence[VariableSpec]) -> set[str]:
    return {s.mask for s in specs if s.mask}


def _coord_names(coords: Coordinates) -> set[str]:
    return {n for n in (coords.lon, coords.lat, coords.level) if n}


def scan_members(paths: Sequence[Path], layout: StateLayout, comm: MPI.Comm) -> list[FileMeta]:
    """Collective: validate every member file; return the metadata of all of them on all ranks.

    Raises the same :class:`InputError` on every rank (the lowest member's
    problem) if any file is missing, not netCDF, or does not match the layout.
    """
    mine: dict[int, FileMeta] = {}
    note: ErrorNote = None
    for m in range(comm.rank, len(paths), comm.size):
        try:
            mine[m] = _checked(paths[m], layout)
        except Exception as exc:
            note = note_error(exc)
            break
    raise_if_any(comm, note)
    merged: dict[int, FileMeta] = {}
    for part in comm.allgather(mine):
        merged.update(part)
    return [merged[m] for m in range(len(paths))]


def root_layout(config: Config, comm: MPI.Comm) -> StateLayout:
    """Collective: rank 0 builds the layout from member 1 and shares it."""
    first = config.member_paths()[0]

    def build() -> StateLayout:
        key = (first, _identity(first), config.ensemble.variables, config.ensemble.coordinates)
        layout = _LAYOUTS.get(key)
        if layout is None:
            _LAYOUTS.clear()
            layout = _LAYOUTS[key] = layout_from_member(config, first)
        return layout

    return root_call(comm, build)


def _dims(dims: tuple[str, ...], shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(f"{d}={n}" for d, n in zip(dims, shape, strict=True)) + ")"
