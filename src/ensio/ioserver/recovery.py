"""Publishing staged output files, and recovering the ones a dead run left behind.

:func:`publish` turns a staging file (:mod:`.staged`) into its final file
holding its published records: a rename for ``cdf5``; for ``netcdf4`` a copy
of the header and of the first ``numrecs`` records into a netCDF-4 temporary
(chunking and compression as the staging header records them), flushed and
renamed over the final name, then the staging file is removed. A kill at any
instant leaves the staging file (still recoverable) or the final file.

:func:`recover_dir` (``ensio ioserver recover DIR``, and every server when it
starts writing into a directory) publishes every staging file no live writer
holds (their ``flock``), or deletes it when it holds no complete record.

A full disk: the netCDF-4 copy needs space; when it fails for lack of space
the staging file (CDF-5, every complete record) is renamed to the final name
instead, which needs none, and the error says so. The netCDF/HDF5 libraries
do not always pass the system's errno on (``NetCDF: HDF error``), so
:func:`no_space` also probes the directory.
"""

from __future__ import annotations

import errno
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import faults
from ..durable import fsync_path, temporary_name, temporary_of
from ..errors import FileOpError, os_error_reason
from ..io.formats import record_layout
from .staged import ATTR_PREFIX, CHUNKS_ATTR, COMPLEVEL_ATTR, FORMAT_ATTR, STAGE_TOKEN, lock_staging

__all__ = ["Published", "publish", "recover_dir", "no_space", "NO_SPACE"]

NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device"
_PROBE_BYTES = 1 << 16
_COPY_BYTES = 64 << 20  # bytes per read/write of the netCDF-4 copy


@dataclass(frozen=True)
class Published:
    """What :func:`publish` did: the final path (None if deleted), records, format."""

    path: Path | None
    records: int
    fmt: str
    note: str = ""  #: why the format differs from the configured one ("" when it does not)


def no_space(exc: BaseException, directory: Path) -> bool:
    """Whether ``exc`` (raised by a write into ``directory``) means the disk is full.

    The errno when there is one; else (a library error without it) a probe:
    little free space left, or a small write into the directory fails with ENOSPC.
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if NO_SPACE in str(seen):
            return True
        seen = seen.__cause__
    try:
        st = os.statvfs(directory)
        if st.f_bavail * st.f_frsize < _PROBE_BYTES:
            return True
        probe = temporary_name(directory / "space-probe")
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, bytes(_PROBE_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
    except OSError as probe_exc:
        return probe_exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return False


def _to_netcdf4(staging: Path, target: Path, numrecs: int) -> None:
    """Copy the header and the first ``numrecs`` records of ``staging`` into ``target``."""
    import netCDF4

    with netCDF4.Dataset(staging) as src, netCDF4.Dataset(target, "w", format="NETCDF4") as dst:
        src.set_auto_maskandscale(False)  # bytes as stored (packed integers stay packed)
        level = int(src.getncattr(COMPLEVEL_ATTR)) if COMPLEVEL_ATTR in src.ncattrs() else 0
        dst.setncatts({k: src.getncattr(k) for k in src.ncattrs() if not k.startswith(ATTR_PREFIX)})
        for name, dim in src.dimensions.items():
            dst.createDimension(name, None if dim.isunlimited() else len(dim))
        for name, v in src.variables.items():
            kwargs: dict = {}
            attrs = v.ncattrs()
            if "_FillValue" in attrs:
                kwargs["fill_value"] = v.getncattr("_FillValue")
            if CHUNKS_ATTR in attrs:
                kwargs["chunksizes"] = [int(x) for x in np.atleast_1d(v.getncattr(CHUNKS_ATTR))]
                if level:
                    kwargs.update(zlib=True, complevel=level, shuffle=True)
            w = dst.createVariable(name, v.dtype, v.dimensions, **kwargs)
            w.set_auto_maskandscale(False)  # the Dataset's setting covers only older variables
            w.setncatts({k: v.getncattr(k) for k in attrs
                         if k != "_FillValue" and not k.startswith(ATTR_PREFIX)})
        for name, v in src.variables.items():
            timed = bool(v.dimensions) and src.dimensions[v.dimensions[0]].isunlimited()
            if not timed:
                dst[name][...] = v[...]
                continue
            per = max(1, v.dtype.itemsize * int(np.prod(v.shape[1:])))
            step = max(1, _COPY_BYTES // per)  # records per copy: bounded memory
            for r in range(0, numrecs, step):
                end = min(r + step, numrecs)
                dst[name][r:end] = v[r:end]


def _staged_format(staging: Path) -> str:
    """``netcdf4`` when the staging header asks for a netCDF-4 copy, else ``cdf5``."""
    import netCDF4

    with netCDF4.Dataset(staging) as ds:
        return str(ds.getncattr(FORMAT_ATTR)) if FORMAT_ATTR in ds.ncattrs() else "cdf5"


def publish(staging: Path, final: Path, fd: int, numrecs: int, *, has_records: bool = True,
            durable: bool = True) -> Published:
    """Make ``final`` the published form of ``staging`` (the caller holds its lock on ``fd``).

    ``numrecs`` records are kept (bytes beyond them are dropped). A file with
    record variables and no complete record is deleted, not published.

    Raises
    ------
    FileOpError
        Naming ``final``: the copy failed (not for lack of space: the staging
        file is kept for ``ensio ioserver recover``), or the disk is full and the
        file was published as CDF-5 (the message says so).
    """
    layout = record_layout(staging)
    end = layout.data_end(numrecs) if has_records and numrecs else 0
    if has_records and numrecs == 0:
        staging.unlink()
        return Published(None, 0, "")
    if end and os.fstat(fd).st_size > end:
        os.ftruncate(fd, end)
    fmt = _staged_format(staging)
    note = ""
    if fmt == "netcdf4":
        tmp = temporary_name(final)
        try:
            _to_netcdf4(staging, tmp, numrecs)
            if durable:
                fsync_path(tmp)
            faults.point("ioserver-converted")
            os.replace(tmp, final)
        except Exception as exc:
            full = no_space(exc, final.parent)
            tmp.unlink(missing_ok=True)
            if not full:
                raise FileOpError(f"cannot write {final}: {_reason(exc)} (its {numrecs} "
                                  f"complete records are kept in {staging.name})") from exc
            fmt = "cdf5"
            note = (f"cannot write {final} as netCDF-4: {NO_SPACE}; published as CDF-5 "
                    f"with its {numrecs} complete records")
        else:
            staging.unlink()
    if fmt == "cdf5":
        if durable:
            os.fsync(fd)
        os.replace(staging, final)
    if durable:
        fsync_path(final.parent, directory=True)
    faults.point("ioserver-published-file")
    return Published(final, numrecs, fmt, note)


def _reason(exc: BaseException) -> str:
    return os_error_reason(exc) if isinstance(exc, OSError) else str(exc) or type(exc).__name__


def recover_dir(directory: str | os.PathLike[str], *, quiet: bool = False) -> list[Published]:
    """Publish (or delete, if empty) every staging file in ``directory`` no live writer holds.

    Prints one line per file on stderr unless ``quiet``. A staging file that
    cannot be read as netCDF (killed while its header was being created) holds
    no record: it is deleted.
    """
    directory = Path(directory)
    done: list[Published] = []
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return done  # nothing written there yet (creating a file there says what is wrong)
    for entry in entries:
        found = temporary_of(entry.name)
        if found is None or found[1:] != ("partial", STAGE_TOKEN) or not entry.is_file():
            continue
        result = _recover_one(Path(entry.path), directory / found[0])
        if result is None:
            continue
        done.append(result)
        if not quiet:
            print(_describe(result, directory / found[0]), file=sys.stderr, flush=True)
    return done


def _recover_one(staging: Path, final: Path) -> Published | None:
    try:
        fd = os.open(staging, os.O_RDWR)
    except FileNotFoundError:
        return None  # published meanwhile by its writer or another recovery
    try:
        if not lock_staging(fd) or os.fstat(fd).st_nlink == 0:
            return None  # a live writer, or already published and removed
        for entry in os.scandir(final.parent):  # a copy killed before its rename
            other = temporary_of(entry.name)
            if other is not None and other[:2] == (final.name, "tmp"):
                Path(entry.path).unlink(missing_ok=True)
        try:
            layout = record_layout(staging)
        except Exception:  # no readable header: killed while it was created
            staging.unlink()
            return Published(None, 0, "")
        return publish(staging, final, fd, layout.numrecs, has_records=bool(layout.vars))
    finally:
        os.close(fd)


def _describe(p: Published, final: Path) -> str:
    if p.path is None:
        return f"ensio ioserver recover: {final}: no complete record, leftover deleted"
    extra = f" ({p.note})" if p.note else ""
    return (f"ensio ioserver recover: {final}: published with {p.records} complete "
            f"record{'s' if p.records != 1 else ''} ({p.fmt}){extra}")
