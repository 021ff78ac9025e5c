"""The two baselines of ``ensio bench io``: the raw limit and the naive scheme.

Both work on the same member files and byte ranges as ensio's own read and
write (:mod:`ensio.bench.io` explains what each one measures and why):

* **raw limit** — one process, plain sequential ``os.preadv`` / ``os.pwritev``
  of exactly the state variables' byte ranges (:func:`raw_read`,
  :func:`raw_write`), and one extra write of those bytes to a new file
  (:func:`raw_append`, what the undo journal adds);
* **naive** — rank 0 reads each member with netCDF4 and ``Scatterv``s the rows
  (:func:`naive_read`); writing gathers to rank 0, which writes with netCDF4
  (:func:`naive_write`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
from mpi4py import MPI

from ..durable import fsync_path
from ..errors import InputError
from ..parallel.agree import ErrorNote, note_error, raise_if_any
from ..parallel.distribution import RowDistribution

__all__ = ["RawRanges", "naive_read", "naive_write", "raw_append", "raw_ranges", "raw_read",
           "raw_write", "warm_page_cache"]

_CHUNK = 1 << 24


@dataclass(frozen=True)
class RawRanges:
    """Byte ranges ``(offset, nbytes)`` of the state variables, per member file."""

    paths: tuple[Path, ...]
    ranges: tuple[tuple[tuple[int, int], ...], ...]

    @property
    def nbytes(self) -> int:
        return sum(n for rs in self.ranges for _, n in rs)


def raw_ranges(paths: Sequence[Path], names: Sequence[str]) -> RawRanges | None:
    """The byte ranges of variables ``names`` in every file (``None`` if one has no raw offset).

    Offsets come from :func:`ensio.io.formats.open.open_member` (HDF5 dataset offset,
    classic ``begin``), the same metadata the real implementation uses. Ranges
    are sorted by offset so the raw limit reads each file front to back.
    """
    from ..io.formats.open import open_member

    ranges = []
    for path in paths:
        with open_member(path) as store:
            infos = store.variables()
        rs = []
        for name in names:
            info = infos[name]
            if info.raw_offset is None:
                return None
            rs.append((int(info.raw_offset), int(info.nbytes)))
        ranges.append(tuple(sorted(rs)))
    return RawRanges(tuple(paths), tuple(ranges))


def raw_read(raw: RawRanges, buf: np.ndarray) -> None:
    """Sequential ``preadv`` of every range into the byte buffer ``buf`` (one process)."""
    view = memoryview(buf).cast("B")
    pos = 0
    for path, rs in zip(raw.paths, raw.ranges, strict=True):
        fd = os.open(path, os.O_RDONLY)
        try:
            for off, n in rs:
                done = 0
                while done < n:
                    got = os.preadv(fd, [view[pos + done : pos + n]], off + done)
                    if got <= 0:
                        raise OSError(f"{path}: unexpected end of file at byte {off + done}")
                    done += got
                pos += n
        finally:
            os.close(fd)


def raw_write(raw: RawRanges, buf: np.ndarray, fsync: bool) -> None:
    """Sequential ``pwritev`` of ``buf`` back into every range (the mirror of :func:`raw_read`)."""
    view = memoryview(buf).cast("B")
    pos = 0
    for path, rs in zip(raw.paths, raw.ranges, strict=True):
        fd = os.open(path, os.O_WRONLY)
        try:
            for off, n in rs:
                done = 0
                while done < n:
                    done += os.pwritev(fd, [view[pos + done : pos + n]], off + done)
                pos += n
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)


def raw_append(raw: RawRanges, buf: np.ndarray, fsync: bool) -> None:
    """One extra write of the state bytes: append them to a new file, then delete it.

    This is what the undo journal adds to an in-place write (its log is new
    data, deleted at commit), measured with no journal logic at all.
    """
    view = memoryview(buf).cast("B")
    target = raw.paths[0].parent / ".ensio-bench-extra-write"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pos = 0
        for rs in raw.ranges:
            for _, n in rs:
                done = 0
                while done < n:
                    done += os.write(fd, view[pos + done : pos + n])
                pos += n
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(target)


def _member_vector(ds: netCDF4.Dataset, layout: Any, out: np.ndarray) -> None:
    """Fill ``out`` (N_x, float64) with one member's state, in layout order."""
    for v in layout.variables:
        flat = np.asarray(ds.variables[v.name][:]).reshape(-1)
        active = getattr(v, "active", None)
        out[v.offset : v.offset + v.size] = flat if active is None else flat[active]


def naive_read(paths: Sequence[Path], comm: MPI.Comm, layout: Any) -> np.ndarray:
    """Collective: rank 0 reads each member with netCDF4 and scatters its rows.

    Returns this rank's ``(N_e, count)`` float64 block, same distribution as ensio's.
    """
    dist = RowDistribution.of(layout.n_rows, comm)
    counts, displs = dist.counts, dist.starts
    data = np.empty((len(paths), dist.count), dtype=np.float64)
    vec = np.empty(layout.n_rows, dtype=np.float64) if comm.rank == 0 else None
    err: ErrorNote = None
    for m, path in enumerate(paths):
        if vec is not None and err is None:
            try:
                with netCDF4.Dataset(path, "r") as ds:
                    ds.set_auto_maskandscale(False)
                    _member_vector(ds, layout, vec)
            except Exception as exc:  # raised on every rank below: nobody hangs
                err = note_error(RuntimeError(f"naive read of {path}: {exc}"))
        send = [vec, counts, displs, MPI.DOUBLE] if vec is not None else None
        comm.Scatterv(send, data[m], root=0)
    raise_if_any(comm, err)
    return data


def naive_write(
    paths: Sequence[Path], comm: MPI.Comm, layout: Any, data: np.ndarray, fsync: bool
) -> None:
    """Collective: gather each member's rows to rank 0, which writes them with netCDF4."""
    dist = RowDistribution.of(layout.n_rows, comm)
    counts, displs = dist.counts, dist.starts
    vec = np.empty(layout.n_rows, dtype=np.float64) if comm.rank == 0 else None
    err: ErrorNote = None
    for m, path in enumerate(paths):
        recv = [vec, counts, displs, MPI.DOUBLE] if vec is not None else None
        comm.Gatherv(np.ascontiguousarray(data[m]), recv, root=0)
        if vec is None or err is not None:
            continue
        try:
            with netCDF4.Dataset(path, "r+") as ds:
                ds.set_auto_maskandscale(False)
                for v in layout.variables:
                    var = ds.variables[v.name]
                    rows = vec[v.offset : v.offset + v.size]
                    active = getattr(v, "active", None)
                    if active is not None:
                        full = np.asarray(var[:]).reshape(-1).astype(np.float64)
                        full[active] = rows
                        rows = full
                    var[:] = rows.reshape(v.shape)
            if fsync:
                fsync_path(path)
        except Exception as exc:  # raised on every rank below: nobody hangs
            err = note_error(RuntimeError(f"naive write of {path}: {exc}"))
    raise_if_any(comm, err)


def warm_page_cache(paths: Sequence[Path]) -> None:
    """Read every file once so all schemes start from the same (hot) page cache."""
    buf = bytearray(_CHUNK)
    for path in paths:
        try:
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass
        except FileNotFoundError:
            raise InputError(f"{path}: member file not found") from None
        except OSError as exc:
            raise InputError(f"{path}: cannot read member file ({exc.strerror})") from None
