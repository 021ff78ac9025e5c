"""Raw byte-range I/O of contiguous, uncompressed variables (the fast path).

A variable with a ``VarInfo.raw_offset`` is one plain byte range of the file,
so element ``i`` lives at ``raw_offset + i * itemsize``. Many I/O tasks can then
read or write their own element ranges of the same file concurrently with
positional system calls, without the netCDF library, without locks, and
without ever touching a byte outside the range (which is what makes in-place
writes safe to journal and to run in parallel).

``os.preadv`` / ``os.pwritev`` move data directly between the file and the
numpy buffer: unlike ``os.pread`` they create no intermediate ``bytes``
object, so a multi-GiB segment is copied once (kernel ↔ array), not twice.
The arrays keep the on-disk dtype (e.g. ``>f8``); converting to the compute
dtype is one ``astype`` by the caller, fused with the byte swap.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ...errors import InputError
from .store import VarInfo

__all__ = ["raw_read", "raw_read_records", "raw_write"]


def _file_name(fd: int, path: str | os.PathLike[str] | None) -> str:
    """Name of the file behind ``fd`` for messages (``/proc`` lookup if not given)."""
    if path is not None:
        return os.fspath(path)
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"<file descriptor {fd}>"


def _byte_offset(info: VarInfo, lo: int, hi: int) -> int:
    """File offset of element ``lo``; validates the element range."""
    if info.raw_offset is None:
        raise ValueError(f"variable {info.name!r} has no raw offset (library path only)")
    if not 0 <= lo <= hi <= info.size:
        raise ValueError(
            f"element range [{lo}, {hi}) outside variable {info.name!r} of size {info.size}"
        )
    return info.raw_offset + lo * info.dtype.itemsize


def _byte_view(arr: np.ndarray) -> memoryview:
    """Writable-or-not flat byte view of a C-contiguous 1-D array (no copy)."""
    return memoryview(arr.view(np.uint8))


def raw_read(
    fd: int,
    info: VarInfo,
    lo: int,
    hi: int,
    out: np.ndarray | None = None,
    *,
    path: str | os.PathLike[str] | None = None,
) -> np.ndarray:
    """Read flat elements ``[lo, hi)`` of a contiguous variable straight from the file.

    Parameters
    ----------
    fd : int
        File descriptor opened for reading (``os.open(path, os.O_RDONLY)``).
    info : VarInfo
        The variable; ``info.raw_offset`` must not be ``None``.
    lo, hi : int
        Flat C-order element range, ``0 <= lo <= hi <= info.size``.
    out : numpy.ndarray, optional
        Destination, shape ``(hi - lo,)``, dtype exactly ``info.dtype``,
        C-contiguous and writable; lets the caller reuse buffers.
    path : path-like, optional
        File name for error messages (looked up from ``fd`` if omitted).

    Returns
    -------
    numpy.ndarray
        ``out`` (or a new array) of the on-disk dtype, byte order as stored.

    Raises
    ------
    InputError
        If the file ends before ``hi`` (truncated file).
    """
    start = _byte_offset(info, lo, hi)
    n = hi - lo
    if out is None:
        out = np.empty(n, dtype=info.dtype)
    elif (
        out.dtype != info.dtype
        or out.shape != (n,)
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        raise ValueError(
            f"out must be a writable C-contiguous array of shape ({n},) and dtype "
            f"{info.dtype.str}, got shape {out.shape} dtype {out.dtype.str}"
        )
    buf = _byte_view(out)
    total = len(buf)
    done = 0
    while done < total:
        # Short reads happen (signals, >2 GiB requests on Linux); 0 means EOF.
        got = os.preadv(fd, [buf[done:]], start + done)
        if got == 0:
            raise InputError(
                f"{_file_name(fd, path)}: truncated file (variable {info.name!r} needs "
                f"bytes up to offset {start + total}, file ends at {start + done})"
            )
        done += got
    return out



def raw_read_records(
    fd: int, info: VarInfo, begin: int, stride: int, lo: int, hi: int, *,
    path: str | os.PathLike[str] | None = None,
) -> np.ndarray:
    """Flat elements ``[lo, hi)`` of a variable stored record by record (native byte order).

    Record ``r`` (``info.shape[1:]``, contiguous) starts at ``begin + r * stride``:
    the record variables of a netCDF classic file. Why not the netCDF library:
    opening a file with it parses all its metadata (milliseconds), which for a
    one-value time coordinate cost 40 times the rest of a member's check.

    Raises
    ------
    ValueError
        ``[lo, hi)`` is not inside the variable.
    InputError
        The file ends before a record (truncated file).
    """
    if not 0 <= lo <= hi <= info.size:
        raise ValueError(
            f"element range [{lo}, {hi}) outside variable {info.name!r} of size {info.size}"
        )
    per = info.size // info.shape[0] if info.size else 1
    out = np.empty(hi - lo, dtype=info.dtype)
    pos = lo
    while pos < hi:
        r, first = divmod(pos, per)
        end = min(hi, (r + 1) * per)
        one = VarInfo(info.name, info.dims[1:], info.shape[1:], info.dtype, begin + r * stride)
        raw_read(fd, one, first, first + end - pos, out[pos - lo : end - lo], path=path)
        pos = end
    return out.astype(info.dtype.newbyteorder("="), copy=False)

def raw_write(
    fd: int,
    info: VarInfo,
    lo: int,
    values: np.ndarray,
    *,
    path: str | os.PathLike[str] | Path | None = None,
) -> None:
    """Overwrite flat elements ``[lo, lo + values.size)`` of a contiguous variable in place.

    ``values`` (any shape, read in C order) is converted to the on-disk dtype
    with ``astype`` semantics (one copy, fused with the byte swap; none if it
    already has that dtype). Exactly the bytes of the range are written.

    Parameters
    ----------
    fd : int
        File descriptor opened for writing (``os.open(path, os.O_RDWR)``).
    info : VarInfo
        The variable; ``info.raw_offset`` must not be ``None``.
    lo : int
        First flat element to overwrite.
    values : numpy.ndarray
        The new values; ``lo + values.size <= info.size``.
    path : path-like, optional
        File name for error messages.
    """
    flat = np.asarray(values).reshape(-1)
    start = _byte_offset(info, lo, lo + flat.size)
    data = np.ascontiguousarray(flat, dtype=info.dtype)
    buf = _byte_view(data)
    total = len(buf)
    done = 0
    while done < total:
        put = os.pwritev(fd, [buf[done:]], start + done)
        if put == 0:  # pragma: no cover - regular files never do this
            raise OSError(f"{_file_name(fd, path)}: write made no progress at {start + done}")
        done += put
