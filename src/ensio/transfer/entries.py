"""The records of the staging daemon's table: a client, a reply, a held version of a file.

Apart from :mod:`.table` so that the modules that only pass them around
(:mod:`.daemon`, :mod:`.network`, :mod:`.names`) need not read the table's logic.
"""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass, field

from . import materialize
from .pool import trim
from .progress import Progress

__all__ = ["Entry", "Peer", "Reply"]


#: The seals of a held file: its bytes and size are final.
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL


@dataclass(frozen=True)
class Peer:
    """A connected client: its connection id, component and process."""

    id: int
    component: str
    pid: int

    def __str__(self) -> str:
        return f"{self.component} (pid {self.pid})"


@dataclass(frozen=True)
class Reply:
    """A reply packet: verb, fields and an optional descriptor the daemon closes after sending."""

    verb: str
    fields: dict[str, object] = field(default_factory=dict)
    fd: int | None = None
    fd2: int | None = None   # a second descriptor: a partial file's progress map

    @classmethod
    def err(cls, code: int) -> Reply:
        return cls("ERR", {"errno": code})


@dataclass(eq=False)
class Entry:
    """One held version of a file."""

    id: int
    path: str
    fd: int | None
    conn: str
    component: str
    writer: Peer | None
    mode: int
    budget: int
    fallback: str
    persist: bool
    state: str = "writing"
    persist_state: str = ""
    waiters: int = 0
    sent: int = 0          # bytes streamed to other hosts (all of them together)
    after_close: int = 0   # of which after the producer's close
    pooled: bool = False   # the memory came pre-faulted from the pool: trim its tail
    progress: Progress | None = None  # arriving from another host, its final size known
    origin: str = ""       # a copy from another host: "identity@host" (names.py)
    why: str = ""          # failed: why (the log line of an open)
    failed_at: float = 0.0  # failed: when (wall clock; a real file written later wins)
    budget_key: str = ""   # whose budget it counts against: its connection, or the host's
    keep: str = "until-unlinked"   # the connection's keep (budget.py)
    consumers: frozenset[str] = frozenset()   # the connection's to components
    consumed: set[str] = field(default_factory=set)   # components that consumed it
    readers: set[tuple[int, str]] = field(default_factory=set)  # (pid, component) opened it

    def size(self) -> int:
        return os.fstat(self.fd).st_size if self.fd is not None else 0

    def release(self) -> None:
        """Close the daemon's descriptor: the memory goes when the last reader closes."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def seal(self) -> None:
        """Seal the memory and hold it through a descriptor of our own.

        The descriptor received from the producer shares its open file description,
        and with it any lock the producer took (HDF5 flocks its files): a fresh
        description from ``/proc/self/fd`` carries none. A writable mapping still
        alive (EBUSY) gets a sealed copy instead. A file that takes no seals (a
        huge-page tmpfs file, :mod:`.hugemem`: ``F_SEAL_SEAL`` from its creation) is
        held read-only unsealed: the producer's descriptors are closed by now.
        """
        assert self.fd is not None
        try:
            if not fcntl.fcntl(self.fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SEAL:
                fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, SEALS)
            if self.pooled:
                trim(self.fd)  # sealed: no one writes past the end any more
            fresh = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            fresh = os.memfd_create(os.path.basename(self.path),
                                    os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            materialize.copy_into(self.fd, fresh)  # the copy has no tail to trim
            fcntl.fcntl(fresh, fcntl.F_ADD_SEALS, SEALS)
        os.close(self.fd)
        self.fd = fresh
