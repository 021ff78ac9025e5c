"""Member-file metadata: the state layout and a validated scan of all members.

Why a separate metadata pass: opening a netCDF-4 file costs milliseconds, and
a bad member must be reported before the first byte moves (and before anything
is written). The scan spreads the N_e opens over all ranks, checks every file
against the layout, and shares the small per-file results (raw offsets and
on-disk dtypes), so the data pipeline itself only issues ``pread``/``pwrite``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ..config.schema import Config, ConfigError
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


def scan_members(paths: Sequence[Path], layout: StateLayout, comm: MPI.Comm) -> list[FileMeta]:
    """Collective: validate every member file; return the metadata of all of them on all ranks.

    Raises the same :class:`InputError` on every rank (the lowest member's
    problem) if any file is missing, not netCDF, or does not match the layout.
    """
    mine: dict[int, FileMeta] = {}
    note: ErrorNote = None
    for m in range(comm.rank, len(paths), comm.size):
        try:
            mine[m] = check_member(paths[m], layout)
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
    return root_call(comm, lambda: layout_from_member(config, first))


def _dims(dims: tuple[str, ...], shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(f"{d}={n}" for d, n in zip(dims, shape, strict=True)) + ")"
