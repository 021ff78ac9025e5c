"""One output file of one writer, staged as CDF-5 until it is published.

Why staging, and why CDF-5 whatever the configured format: a file the server
is writing must be recoverable at every instant (SIGKILL of the server or of
the job, a full disk), holding exactly the records that were complete. HDF5
(netCDF-4) gives no such guarantee between flushes: a process killed while the
library updates its metadata, or a write refused for lack of space, can leave a
file whose dimensions claim records that were never written or whose metadata
cannot be read ("NetCDF: HDF error"). A CDF-5 file has one publication point:
the ``numrecs`` field of its header (8 bytes at offset 4). Records are written
with positional writes at the classic layout's offsets (``io.formats``: the
byte-range machinery of ``io/``, as :mod:`.shared` does for files written by
several servers), and ``numrecs`` is raised only after every byte of the
records (data and time coordinates) is written. A reader (or the recovery)
sees the records before the last publication and ignores the bytes beyond them.

Names: the staging file is ``.NAME.ensio-partial.ioserver`` beside the final
``NAME`` (:func:`ensio.durable.temporary_name`, kind ``partial``, token
``ioserver``: what a rerun or ``ensio ioserver recover`` finds). The writer
holds an exclusive ``flock`` on it while it is open, so a recovery running at
the same time (another server starting in the same directory) never touches a
live file: the kernel drops the lock when the writer dies.

Publishing (:func:`.recovery.publish`) turns it into the final file: renamed
as it is (``cdf5``) or copied into netCDF-4 (``netcdf4``: chunking and
compression as configured, recorded in the staging header's ``ensio_staged_*``
attributes so that a recovery in another process converts it the same way).
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .. import faults
from ..durable import temporary_name
from ..io.formats import raw_write, record_layout
from ..io.formats.classic import read_classic_header

__all__ = ["STAGE_TOKEN", "ATTR_PREFIX", "StagedFile", "staging_path", "lock_staging"]

#: Token of the staging files (``.NAME.ensio-partial.ioserver``).
STAGE_TOKEN = "ioserver"
#: Global and variable attributes of a staging file that the netCDF-4 copy drops.
ATTR_PREFIX = "ensio_staged_"
FORMAT_ATTR = ATTR_PREFIX + "format"
COMPLEVEL_ATTR = ATTR_PREFIX + "complevel"
CHUNKS_ATTR = ATTR_PREFIX + "chunksizes"


def staging_path(final: str | os.PathLike[str]) -> Path:
    """The staging file of the output file ``final`` (same directory)."""
    return temporary_name(final, "partial", STAGE_TOKEN)


def lock_staging(fd: int) -> bool:
    """Take the writer's exclusive lock on a staging file; False if someone holds it.

    A file system without ``flock`` (Lustre mounted without ``-o flock``) gives
    no lock: True, so a recovery there must not run beside a live writer of the
    same directory (two runs writing into one directory at once).
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            return True
        raise
    return True


class StagedFile:
    """A CDF-5 staging file written record by record with positional writes.

    Parameters
    ----------
    final : Path
        The file it becomes when published.
    define : callable
        ``define(ds, fmt)`` with the open ``netCDF4.Dataset`` (CDF-5):
        dimensions (``time`` unlimited), variables, attributes and the values
        of the coordinates. It writes no record; ``fmt`` is ``"cdf5"`` (the
        netCDF-4 storage options are not given to CDF-5 variables).
    fmt : {"netcdf4", "cdf5"}
        The format of the published file.
    complevel : int
        zlib level of the netCDF-4 copy (0: none).
    chunks : mapping of str to tuple of int
        netCDF-4 chunk sizes per variable (used by the copy).

    Raises
    ------
    OSError
        From creating the file (the staging file is then removed).
    FileExistsError
        Another live writer holds the staging file of ``final``.
    """

    def __init__(self, final: Path, define: Callable[[Any, str], None], fmt: str,
                 complevel: int = 0, chunks: Mapping[str, tuple[int, ...]] | None = None) -> None:
        import netCDF4  # only where files are written

        self.final = Path(final)
        self.path = staging_path(self.final)
        self.fmt = fmt
        self.numrecs = 0  #: records published (``numrecs`` on disk)
        self._fd = -1
        if self.path.exists():  # a leftover: recovered by now unless a live writer has it
            fd = os.open(self.path, os.O_RDWR)
            try:
                if not lock_staging(fd):
                    raise FileExistsError(
                        f"{self.final}: another process is writing it ({self.path.name} "
                        "is locked)")
                self.path.unlink()
            finally:
                os.close(fd)
        try:
            # Locked before netCDF defines it: another server's start-up recovery
            # in the same directory must never see this file unlocked (it would
            # delete it as a leftover without records). netCDF-C truncates the
            # same inode, so the lock stays.
            self._fd = self._create_locked()
            with netCDF4.Dataset(self.path, "w", format="NETCDF3_64BIT_DATA") as ds:
                define(ds, "cdf5")
                if fmt == "netcdf4":
                    ds.setncattr(FORMAT_ATTR, "netcdf4")
                    ds.setncattr(COMPLEVEL_ATTR, int(complevel))
                    for name, sizes in (chunks or {}).items():
                        ds[name].setncattr(CHUNKS_ATTR, np.asarray(sizes, dtype=np.int64))
            if os.fstat(self._fd).st_ino != os.stat(self.path).st_ino:  # pragma: no cover
                raise OSError(errno.EIO, "the staging file was replaced while it was created",
                              str(self.path))
            self.layout = record_layout(self.path)
            _, infos = read_classic_header(self._fd, self.path)
        except BaseException as exc:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            self.path.unlink(missing_ok=True)
            if isinstance(exc, OSError) and exc.errno is not None:  # name the final file
                raise OSError(exc.errno, os.strerror(exc.errno), str(self.final)) from exc
            raise
        self._fixed = {n: i for n, i in infos.items() if i.raw_offset is not None}
        faults.point("ioserver-staged")

    def _create_locked(self) -> int:
        """Create the staging file empty and take its lock, or fail; a recovery that
        locked and removed it between the two is noticed and the create repeated."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            if not lock_staging(fd):  # pragma: no cover - a recovery holds it a moment
                fcntl.flock(fd, fcntl.LOCK_EX)  # we created it: only a recovery can
            if os.fstat(fd).st_nlink > 0:
                return fd
            os.close(fd)  # removed by a recovery before our lock: create it again

    @property
    def fd(self) -> int:
        """The open descriptor (holds the lock); -1 once closed."""
        return self._fd

    @property
    def record_vars(self) -> bool:
        """Whether the file has record variables (else ``numrecs`` stays 0)."""
        return bool(self.layout.vars)

    # ------------------------------------------------------------------ writing
    def write_record(self, record: int, name: str, values: np.ndarray) -> None:
        """Record ``record`` of record variable ``name`` (not yet published)."""
        info = self.layout.record_info(name, record)
        raw_write(self._fd, info, 0, np.asarray(values).reshape(-1), path=self.final)

    def write_fixed(self, name: str, values: np.ndarray) -> None:
        """The whole of fixed-size variable ``name`` (a ``once`` field)."""
        raw_write(self._fd, self._fixed[name], 0, np.asarray(values).reshape(-1),
                  path=self.final)

    def publish(self, numrecs: int, *, durable: bool = False) -> None:
        """Announce ``numrecs`` records: every byte of them is written.

        The file is first made as long as the records (the last record may end
        in padding nobody writes); with ``durable`` the data is flushed before
        and the header after the announcement (power-loss safety; a process
        kill needs neither).
        """
        if numrecs == self.numrecs:
            if durable:
                os.fdatasync(self._fd)
            return
        end = self.layout.data_end(numrecs)
        if os.fstat(self._fd).st_size < end:
            os.ftruncate(self._fd, end)  # extends without writing data: no space needed
        if durable:
            os.fdatasync(self._fd)
        count = np.array([numrecs], dtype=self.layout.numrecs_dtype)
        os.pwrite(self._fd, count.tobytes(), self.layout.numrecs_offset)
        if durable:
            os.fdatasync(self._fd)
        self.numrecs = numrecs

    def rollback(self) -> None:
        """Drop the bytes of records not published (frees their space on a full disk)."""
        if self.record_vars and self._fd >= 0:
            end = max(self.layout.data_end(self.numrecs), self._header_end())
            if os.fstat(self._fd).st_size > end:
                os.ftruncate(self._fd, end)

    def _header_end(self) -> int:
        """Bytes before the first record (header and fixed-size variables)."""
        return min(v.begin for v in self.layout.vars.values())

    def close(self) -> None:
        """Release the descriptor (and the lock): after publishing, or to leave it behind."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
