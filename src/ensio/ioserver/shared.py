"""One CDF-5 file whose record variables are written by several server ranks.

Why: with several servers a large field would otherwise be gathered to one
server to be written, which makes that server the bottleneck (memory and
bandwidth). Instead each server owns a contiguous range of rows (the first
horizontal dimension ``j``) and writes its rows of every record straight into
the shared file with positional writes at the byte offsets of the classic
layout (``io.formats.record_layout``, ``io.formats.raw_write``: the byte-range
machinery of ``io/``). No parallel netCDF, no locks, no collective call.

Validity at every instant: readers (netCDF library, ``ncdump``, ``cdo``) see
only the records the header's ``numrecs`` announces, and only the owner rank
ever changes ``numrecs``. A rank that has written all its rows of a record
flushes them (``fdatasync``) and sends the owner a non-blocking notice
(``Isend``, tag :data:`NOTICE_TAG` on the servers' communicator). When every
rank's notice for the next records has arrived, the owner writes those
records' time coordinates, flushes, and only then writes the new ``numrecs``
(8 bytes at offset 4, one aligned ``pwrite``) and flushes again. A crash of
any rank at any instant therefore leaves a file holding exactly the records
completed before it: the bytes of a partial record lie beyond the announced
records and are ignored by readers.

Servers never wait for each other while they serve model ranks: ``write_rows``,
``record_done`` and ``poll`` only make independent system calls and
non-blocking MPI calls. Only :meth:`SharedRecordFile.close` is collective.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from ..durable import fsync_path, temporary_name
from ..errors import FileOpError, os_error_reason
from ..io.formats import RecordLayout, raw_write, record_layout
from ..parallel.agree import ErrorNote, agree, note_error, rebuild, root_call
from ..parallel.distribution import RowDistribution

__all__ = ["NOTICE_TAG", "SharedRecordFile"]

#: Tag of the record notices on the servers' communicator (the client protocol
#: uses 7701-7704 on its own duplicated communicator).
NOTICE_TAG = 7711
_CLOSED = -1  # notice payload: this rank sends no more notices


def _create(path: Path, define: Callable[[Any], None], durable: bool) -> RecordLayout:
    """Owner: create the CDF-5 file (under a temporary name, renamed into place)."""
    import netCDF4  # the netCDF library only on the owner, only here

    tmp = temporary_name(path)
    try:
        with netCDF4.Dataset(tmp, "w", format="NETCDF3_64BIT_DATA") as ds:
            ds.set_fill_off()
            define(ds)
        layout = record_layout(tmp)
        if layout.numrecs != 0:
            raise ValueError(
                f"{path}: define() wrote {layout.numrecs} record(s); record variables "
                "are written with write_rows and record_done"
            )
        if durable:
            fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError | RuntimeError):  # the library's too: name the file
            reason = os_error_reason(exc) if isinstance(exc, OSError) else str(exc)
            raise FileOpError(f"cannot create {path}: {reason}") from exc
        raise
    if durable:
        fsync_path(path.parent, directory=True)
    return layout


class SharedRecordFile:
    """One CDF-5 file whose record variables are written by several server ranks.

    Each rank of ``comm`` owns the contiguous row range ``rows`` gives it of
    every *row variable* (by default a record variable whose per-record shape
    is ``(..., nj, ni)``, levels first). The other record variables (``time``,
    ``time_bnds``, zonal means...) are written by the owner from the values
    given to :meth:`record_done`.

    Parameters
    ----------
    path : path-like
        The file; created (replaced) by the owner.
    comm : mpi4py.MPI.Comm
        The servers' communicator; every rank writes rows (possibly none).
    owner : int
        Rank of ``comm`` that creates the file and announces complete records.
    define : callable
        ``define(ds)`` on the owner with the open ``netCDF4.Dataset``: dimensions
        (the record dimension unlimited), variables, attributes, and the values
        of the fixed-size variables. It must write no record.
    rows : RowDistribution
        Distribution of ``nj`` rows over ``comm`` (``RowDistribution.of(nj, comm)``).
    row_axes : mapping of str to int, optional
        The row variables and the axis of the rows in their per-record shape
        (e.g. ``{"ts": 0}`` for unstructured cells ``(ncells,)``). By default every
        record variable whose per-record shape is ``(..., nj, ni)``.
    durable : bool
        Flush (``fdatasync``) rows before a notice and records before ``numrecs``,
        so that a power loss cannot expose unwritten rows either. Without it the
        order still holds against process crashes (the page cache is shared).

    Notes
    -----
    Construction is collective (the owner creates the file and broadcasts the
    layout; an error there is raised on every rank).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        comm: MPI.Comm,
        owner: int,
        define: Callable[[Any], None],
        rows: RowDistribution,
        *,
        row_axes: Mapping[str, int] | None = None,
        durable: bool = True,
    ) -> None:
        if (rows.size, rows.rank) != (comm.size, comm.rank):
            raise ValueError(
                f"rows are distributed over {rows.size} ranks (rank {rows.rank}), "
                f"the communicator has {comm.size} (rank {comm.rank})"
            )
        if not 0 <= owner < comm.size:
            raise ValueError(f"owner {owner} is not a rank of a {comm.size}-rank communicator")
        self.path = Path(path)
        self.comm = comm
        self.owner = owner
        self.rows = rows
        self.durable = durable
        self.is_owner = comm.rank == owner
        self.layout: RecordLayout = root_call(
            comm, lambda: _create(self.path, define, durable), root=owner
        )
        self._row_axis = self._row_axes(None if row_axes is None else dict(row_axes))
        self._fd = self._open_everywhere()
        self._pad = self._end_padding()
        self.bytes_written = 0
        self._written: dict[int, set[str]] = {}  # record -> row variables written here
        self._sends: list[tuple[MPI.Request, np.ndarray]] = []
        # Owner only: notices per record, own time values, records announced.
        self._done: dict[int, set[int]] = {}
        self._times: dict[int, dict[str, np.ndarray]] = {}
        self._closed_ranks: set[int] = set()
        self.numrecs = self.layout.numrecs

    # -- set-up ---------------------------------------------------------------------------
    def _row_axes(self, given: dict[str, int] | None) -> dict[str, int]:
        """Row axis (in the per-record shape) of every row variable."""
        if given is None:  # (..., nj, ni) variables
            return {
                name: len(var.shape) - 2
                for name, var in self.layout.vars.items()
                if len(var.shape) >= 2 and var.shape[-2] == self.rows.n_rows
            }
        out: dict[str, int] = {}
        for name, axis in given.items():
            var = self.layout.vars.get(name)
            if var is None:
                raise ValueError(f"{self.path}: row_axes: {name!r} is not a record variable")
            if not -len(var.shape) <= axis < len(var.shape) or (
                var.shape[axis] != self.rows.n_rows
            ):
                raise ValueError(
                    f"{self.path}: row_axes: axis {axis} of {name!r} (record shape "
                    f"{var.shape}) does not have the {self.rows.n_rows} rows"
                )
            out[name] = axis % len(var.shape)
        return out

    def _open_everywhere(self) -> int:
        """Collective: open the file for writing on every rank, or raise everywhere."""
        fd, note = -1, None
        try:
            fd = os.open(self.path, os.O_WRONLY)
        except OSError as exc:
            note = note_error(exc)
        agreed = agree(self.comm, note)
        if agreed is not None:
            if fd >= 0:
                os.close(fd)
            raise rebuild(agreed)
        return fd

    def _end_padding(self) -> int:
        """Bytes of padding that end every record (after its last variable)."""
        if not self.layout.vars:
            return 0
        first = min(v.begin for v in self.layout.vars.values())
        last = max(
            v.begin + v.dtype.itemsize * math.prod(v.shape) for v in self.layout.vars.values()
        )
        return first + self.layout.recsize - last

    @property
    def row_variables(self) -> tuple[str, ...]:
        """Record variables split by rows (the others are the owner's)."""
        return tuple(self._row_axis)

    def local_shape(self, var: str) -> tuple[int, ...]:
        """Shape of this rank's part of one record of row variable ``var``."""
        shape = list(self.layout.vars[var].shape)
        shape[self._row_axis[var]] = self.rows.count
        return tuple(shape)

    # -- writing --------------------------------------------------------------------------
    def write_rows(self, record: int, var: str, data: np.ndarray) -> None:
        """Write this rank's rows of record ``record`` of ``var`` (no communication).

        Parameters
        ----------
        record : int
            0-based record (time index); records may be written in any order.
        var : str
            A row variable.
        data : numpy.ndarray, shape ``local_shape(var)``
            Any numeric dtype; converted to the on-disk big-endian dtype.
        """
        self._check_open()
        if var not in self._row_axis:
            raise ValueError(f"{self.path}: {var!r} is not a row variable of the file")
        data = np.asarray(data)
        if data.shape != self.local_shape(var):
            raise ValueError(
                f"{self.path}: rows of {var!r} on rank {self.comm.rank} have shape "
                f"{data.shape}, expected {self.local_shape(var)}"
            )
        info = self.layout.record_info(var, record)
        axis = self._row_axis[var]
        lead = math.prod(info.shape[:axis])
        tail = math.prod(info.shape[axis + 1 :])
        if self.rows.count:
            # One contiguous byte range of the record per leading index (level).
            block = data.reshape(lead, self.rows.count * tail)
            for lev in range(lead):
                lo = (lev * self.rows.n_rows + self.rows.start) * tail
                raw_write(self._fd, info, lo, block[lev], path=self.path)
            self.bytes_written += block.size * info.dtype.itemsize
        self._written.setdefault(record, set()).add(var)

    def record_done(self, record: int, time_values: Mapping[str, np.ndarray]) -> None:
        """This rank has written all its rows of ``record``: a non-blocking notice.

        Parameters
        ----------
        record : int
        time_values : mapping of str to numpy.ndarray
            Values of record ``record`` of every record variable that is not a row
            variable (e.g. ``time``, ``time_bnds``), each of its per-record shape;
            used on the owner (the others may pass the same or ``{}``).
        """
        self._check_open()
        if record < 0 or (self.is_owner and record < self.numrecs):
            raise ValueError(f"{self.path}: record {record} cannot be declared done (again)")
        missing = set(self._row_axis) - self._written.get(record, set())
        if missing and self.rows.count:
            raise ValueError(
                f"{self.path}: rank {self.comm.rank} did not write its rows of "
                f"{sorted(missing)} for record {record}"
            )
        if self.is_owner:  # validated before any state changes: a failed call can be retried
            self._times[record] = self._owner_values(record, time_values)
        self._written.pop(record, None)
        if self.durable and self.rows.count:
            os.fdatasync(self._fd)
        if self.is_owner:
            self._done.setdefault(record, set()).add(self.owner)
        else:
            self._notify(record)

    def _owner_values(self, record: int, values: Mapping[str, np.ndarray]) -> dict[str, Any]:
        out = {}
        for name, var in self.layout.vars.items():
            if name in self._row_axis:
                continue
            if name not in values:
                raise ValueError(f"{self.path}: record {record} lacks a value of {name!r}")
            value = np.asarray(values[name])
            if value.shape != var.shape:
                raise ValueError(
                    f"{self.path}: {name!r} of record {record} has shape {value.shape}, "
                    f"expected {var.shape}"
                )
            out[name] = value
        extra = set(values) - set(out) - set(self._row_axis)
        if extra:
            raise ValueError(f"{self.path}: {sorted(extra)} are not record variables")
        return out

    def _notify(self, record: int) -> None:
        buf = np.array([record], dtype=np.int64)
        self._sends.append((self.comm.Isend(buf, dest=self.owner, tag=NOTICE_TAG), buf))
        self._sends = [(req, b) for req, b in self._sends if not req.Test()]

    # -- owner: announcing records --------------------------------------------------------
    def poll(self) -> list[int]:
        """Owner: announce the records now complete on every rank; others: ``[]``.

        Non-blocking: receives the notices that have arrived, then, for the
        next records whose notices are all in (in record order), writes their
        time values, flushes, writes ``numrecs``, flushes.

        Returns
        -------
        list of int
            The records announced by this call.
        """
        self._check_open()
        if not self.is_owner:
            self._sends = [(req, b) for req, b in self._sends if not req.Test()]
            return []
        status = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=NOTICE_TAG, status=status):
            self._receive(status.Get_source())
        return self._announce()

    def _receive(self, source: int) -> None:
        buf = np.empty(1, dtype=np.int64)
        self.comm.Recv(buf, source=source, tag=NOTICE_TAG)
        record = int(buf[0])
        if record == _CLOSED:
            self._closed_ranks.add(source)
        elif record < self.numrecs:
            raise ValueError(
                f"{self.path}: rank {source} declared record {record} done after it was announced"
            )
        else:
            self._done.setdefault(record, set()).add(source)

    def _announce(self) -> list[int]:
        new = []
        while len(self._done.get(self.numrecs + len(new), ())) == self.comm.size:
            new.append(self.numrecs + len(new))
        if not new:
            return []
        for record in new:
            for name, value in self._times.pop(record).items():
                raw_write(self._fd, self.layout.record_info(name, record), 0, value)
            del self._done[record]
        self._pad_record_end(new[-1])
        if self.durable:
            os.fdatasync(self._fd)
        numrecs = np.array([new[-1] + 1], dtype=self.layout.numrecs_dtype)
        os.pwrite(self._fd, numrecs.tobytes(), self.layout.numrecs_offset)
        if self.durable:
            os.fdatasync(self._fd)
        self.numrecs = new[-1] + 1
        return new

    def _pad_record_end(self, record: int) -> None:
        """Write the padding bytes that end ``record`` (nobody else writes them).

        Every variable byte of the record is written by now, but a record ending
        in padding would leave the file shorter than ``numrecs`` announces. A
        truncate cannot be used: another rank may already have written later
        records beyond it.
        """
        if self._pad > 0:
            end = self.layout.data_end(record + 1)
            os.pwrite(self._fd, bytes(self._pad), end - self._pad)

    # -- end ------------------------------------------------------------------------------
    def close(self) -> int:
        """Collective: deliver every notice, announce what is complete, close.

        Records some rank never declared done stay unannounced (the file keeps
        only complete records).

        Returns
        -------
        int
            The number of records in the file (on every rank).
        """
        self._check_open()
        note: ErrorNote = None
        try:
            if self.is_owner:
                others = set(range(self.comm.size)) - {self.owner}
                status = MPI.Status()
                while not others <= self._closed_ranks:
                    self.comm.Probe(source=MPI.ANY_SOURCE, tag=NOTICE_TAG, status=status)
                    try:
                        self._receive(status.Get_source())
                    except ValueError as exc:  # keep receiving: the others wait in bcast
                        note = note or note_error(exc)
                self._announce()
            else:
                self._notify(_CLOSED)
                MPI.Request.Waitall([req for req, _ in self._sends])
                self._sends = []
        except Exception as exc:  # raised on every rank below, nobody hangs
            note = note or note_error(exc)
        finally:
            os.close(self._fd)
            self._fd = -1
        agreed = agree(self.comm, note)
        if agreed is not None:
            raise rebuild(agreed)
        return int(self.comm.bcast(self.numrecs, root=self.owner))

    def _check_open(self) -> None:
        if self._fd < 0:
            raise ValueError(f"{self.path}: shared file is closed")

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
