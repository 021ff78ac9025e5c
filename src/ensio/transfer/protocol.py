"""The staging daemon's message format: the one description shared with the C interposer.

Transport
---------
An ``AF_UNIX`` ``SOCK_SEQPACKET`` socket (``<socket dir>/daemon.sock``): one request
is one packet, one reply is one packet (``STATUS`` answers with one packet per file
and a final ``END``), so a descriptor passed with ``SCM_RIGHTS`` belongs to exactly
one message and no framing is needed. Each interposed process keeps one
connection; the daemon learns that a producer died when it closes. At most
:data:`MAX_PACKET` bytes per packet.

Packet text
-----------
The first line is the verb, every further line ``key=value`` (values are bytes up to
the newline; a path containing a newline is never interposed, so none is sent)::

    CREATE\\npath=/scratch/fc/mem001.nc\\nconn=3fa2c1d09e0b:restarts\\n...

Requests (interposer → daemon), and their replies
-------------------------------------------------
``HELLO component= pid= proto= [rules=]``
    First packet of a connection. ``rules``: the process's rules file, whose ``keep``
    lines give the declared consumers of the connections it produces (:mod:`.budget`).
    → ``OK proto= pid=`` (the daemon's process id)
``CREATE path= conn= budget= fallback= persist= mode= excl= keep= exist=`` + memfd
    A producer creates (or opens for writing) ``path``; the packet carries the
    producer's new memfd. ``budget`` is the connection's limit in bytes (-1: none),
    ``fallback`` ``files|error``, ``persist`` ``0|1``, ``mode`` the permission bits
    (octal, after the umask), ``excl`` ``1`` for ``O_EXCL``, ``keep`` ``1`` when the
    open does not truncate (the daemon copies the current content, held or on disk,
    into the memfd before answering), ``exist`` ``1`` without ``O_CREAT`` (ENOENT if
    the file is neither held nor on disk). → ``OK id= mode=`` (the file's permission
    bits: an existing file keeps its own) | ``FALLBACK`` (use the real path)
    | ``ERR errno=``. Two more fields when the file goes to other hosts:
    ``targets=HOST,HOST`` (the hosts the connection's pattern names for this producer
    process) and ``xmode=sync|async``; the daemon opens a stream to each of them
    (:mod:`.network`) before answering, so consumers there find the file and wait.
``RANGES id= [ack=0] r=OFF+LEN,OFF+LEN,...``
    Async: byte ranges the producer wrote since its last report (a batch: 1 MiB or 64
    ranges). The daemon sends them to the other hosts while the producer runs. → ``OK``,
    or no answer at all with ``ack=0`` (what the interposer sends: a writer never waits
    for the daemon; its next request's answer comes in order behind)
``COMPLETE id= [r=OFF+LEN,...]``
    The producer closed its last descriptor of the file registered as ``id``: the
    daemon seals it (no write, grow or shrink, ever) and wakes waiting consumers.
    Past the budget, a ``fallback: files`` file is written to its real path before the
    reply. With other hosts, the reply waits until each has sealed its copy (sync: the
    whole file is sent now; async: only ``r``, the ranges written since the last
    report, and what was not sent yet). → ``OK`` | ``ERR errno=``. Async to other
    hosts: the reply does not wait for them; it is ``OK pending=1`` and the rest of
    the stream runs in the daemon (:mod:`.settle`).
``OPEN path= wait_ms= defer= conn= [partial=1]``
    A consumer opens ``path`` read-only; blocks while the file is being written, at
    most ``wait_ms``. ``partial=1`` (``serve_partial``): a file arriving from another
    host whose final size is known is answered at once with ``OK partial=1`` and two
    descriptors, the memory (at its final size) and its progress map
    (:mod:`.progress`): the interposer then waits in each read for the bytes it reads.
    A file of an ``all-to-all`` connection (``conn``) that is not held here is pulled
    from the other hosts first (not with ``defer=1``: ``BUSY``).
    → ``OK mode=`` (octal, leading 0) + a new read-only descriptor (its own file offset)
    | ``ABSENT`` (not held: use the real path) | ``BUSY`` |
    ``ERR errno=`` (EIO: the producer died; ETIMEDOUT). With ``defer=1`` the daemon
    answers ``BUSY`` instead of blocking: the interposer asks so on the process's shared
    connection, then waits with a second ``OPEN`` on a connection of its own, without
    holding its lock (the process's other threads go on). ``await=1`` (the process
    consumes ``conn`` and does not produce it): a name neither held nor on disk is
    waited for, up to ``wait_ms``, until a producer creates it or a real file appears
    (then ``ABSENT``); ``ERR errno=ETIMEDOUT`` when nothing does (:mod:`.view`). With
    ``hosts`` the daemon first asks the other hosts for their producer runs
    (:mod:`.names`; ``BUSY`` with ``defer=1``), and the wait ends with ``ERR
    errno=EIO say=`` when the daemon of a host whose producer was running dies.
``STAT path=``
    As ``OPEN`` without waiting (a file being written is reported at its current
    size). → ``OK mode=`` + descriptor | ``ABSENT`` | ``ERR errno=``
``RUN component= produces=CONN,... consumes=CONN,...``
    Every program under the interposer (at each exec) names the connections it
    produces and consumes; its connection's end is the run's end. A consumer's ``OPEN … await=1``
    does not wait once the connection's producer finished (a producer run ended after
    its consumers' last run, none is live: :class:`.view.Runs`). → ``OK``
``LIST dir=``
    The held names (not failed) directly in the absolute directory ``dir``, for the
    interposer's ``readdir``/``glob`` view. → ``OK n= bytes=`` + a sealed memfd of the
    names, one a line (a directory may hold more than one packet carries)
``CHMOD path= mode=``
    New permission bits (octal) of a held file. → ``OK`` | ``ABSENT`` | ``ERR errno=``
``UNLINK path=``
    → ``OK ondisk=0|1`` (``1``: a persisted copy exists, remove it too) | ``ABSENT``
``RENAME old= new= export= [excl=1]``
    Both names transferred (``export=0``): the file moves to ``new``, replacing what
    was held there. ``export=1``: ``new`` is not transferred, so the daemon writes the
    file there (atomically) and forgets ``old``. ``excl=1`` (``RENAME_NOREPLACE``):
    ``EEXIST`` if ``new`` is held or on disk. → ``OK`` | ``ABSENT`` | ``ERR errno=``
``DROP path=``
    A real file was renamed onto a transferred name: forget what was held there.
    → ``OK``
``EXIT status=0``
    The process (a consumer: it opened a transferred file) exits with status 0: the
    files it opened are consumed for its component (``keep``, :mod:`.budget`). Sent at
    exit on a connection of its own. → ``OK``
``SETTLE``
    Sent at exit, on a connection of its own, by a process that had a ``COMPLETE``
    answered ``pending=1``: the answer waits until each of its files reached every
    other host. → ``OK`` | ``ERR errno=EIO fatal=1 say=`` (what failed)

Any ``ERR`` may carry ``say=`` (one line the interposer prints on the program's
stderr: what the program's own message cannot tell, e.g. another host refused our
secret) and ``fatal=1`` (the program's run must fail: an exit status of 0 becomes 1).
``CREATE`` answers so when a host of ``targets`` refuses us or cannot be reached
(``EACCES`` / ``EHOSTUNREACH``; not for ``all-to-all``, whose consumers pull),
``COMPLETE`` (sync) or ``SETTLE`` (async) when a stream to another host failed (``EIO``).

``UNLINK``, ``RENAME`` and ``DROP`` are answered only after every other host holding a
copy of the names acknowledged the change, or was given up on (:mod:`.names`).

Control requests (``ensio run``, ``ensio transfer status|stop``)
----------------------------------------------------------------
``NETWORK identity= host= listen=ADDR:PORT secret=PATH peers=HOST=ADDR:PORT,... pull= producers=``
    ``ensio run`` of a config with ``hosts``: this daemon is ``host`` of experiment
    ``identity``; it listens on ``listen`` (TCP, that address only) and accepts
    streams proved with the secret in ``PATH``; ``pull`` lists the connections
    (``identity:name``) pulled on demand; ``producers`` the hosts each connection's
    producer is placed on (``NAME:HOST:HOST,...``; a consumer waits until each has
    ended a round). → ``OK`` | ``ERR errno= why=``
``STATUS`` → ``FILE path= size= state= component= conn= persist= consumed= waiters=
sent= after_close=`` … ``END`` (``consumed``: the components that consumed it;
``waiters``: consumers blocked in an open of the file; ``sent``: bytes streamed to
other hosts, ``after_close`` of them after the producer's close)
``STOP`` → ``OK``; the daemon then exits (see :mod:`.daemon` for held files).

Errors are Linux ``errno`` numbers: daemon and interposer run on the same host.
Daemon-to-daemon TCP is :mod:`.wire`.
"""

from __future__ import annotations

import array
import errno
import os
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

__all__ = [
    "MAX_PACKET",
    "PROTOCOL_VERSION",
    "Client",
    "DaemonUnavailable",
    "FileStatus",
    "Message",
    "decode",
    "encode",
    "recv_message",
    "send_message",
]

PROTOCOL_VERSION = 1
#: The files of a daemon's directory (here, not in ``daemon``: ``ensio run --transfer``
#: needs the names to find a daemon, and importing the daemon costs it start-up time).
LOCK_NAME = "daemon.lock"
SOCKET_NAME = "daemon.sock"
LOG_NAME = "daemon.log"
_CLOSED = "the staging daemon closed the connection"
#: Largest packet (two paths of PATH_MAX and the other fields fit).
MAX_PACKET = 16384


class DaemonUnavailable(OSError):
    """No staging daemon answers on the socket."""


@dataclass(frozen=True)
class Message:
    """One packet: a verb, its fields and at most one descriptor."""

    verb: str
    fields: Mapping[str, str]
    fd: int | None = None
    fd2: int | None = None   #: a second descriptor (``OPEN``'s reply with ``partial=1``)

    def get(self, key: str, default: str = "") -> str:
        return self.fields.get(key, default)

    def int(self, key: str, default: int = 0) -> int:
        v = self.fields.get(key)
        return default if v is None or v == "" else int(v)


def encode(verb: str, **fields: object) -> bytes:
    """The packet text of ``verb`` with ``fields`` (str/bytes/int values, no newlines)."""
    parts = [verb.encode()]
    for k, v in fields.items():
        val = v if isinstance(v, bytes) else os.fsencode(str(v))
        if b"\n" in val:
            raise ValueError(f"protocol field {k}: newline in value")
        parts.append(k.encode() + b"=" + val)
    data = b"\n".join(parts)
    if len(data) > MAX_PACKET:
        raise ValueError(f"protocol: {verb} packet of {len(data)} bytes exceeds {MAX_PACKET}")
    return data


def decode(data: bytes, fd: int | None = None) -> Message:
    """Parse a packet (bytes values decoded with the file-system encoding)."""
    lines = data.split(b"\n")
    fields = {}
    for line in lines[1:]:
        k, sep, v = line.partition(b"=")
        if sep:
            fields[k.decode("ascii", "replace")] = os.fsdecode(v)
    return Message(verb=lines[0].decode("ascii", "replace"), fields=fields, fd=fd)


def send_message(sock: socket.socket, data: bytes, fd: int | None = None,
                 fd2: int | None = None) -> None:
    """Send one packet, with ``fd`` (and ``fd2``) passed by ``SCM_RIGHTS`` when given."""
    fds = [f for f in (fd, fd2) if f is not None]
    if not fds:
        sock.sendall(data)
    else:
        socket.send_fds(sock, [data], fds)


def recv_message(sock: socket.socket) -> Message | None:
    """Receive one packet (None when the peer closed); descriptors past two are closed."""
    fds = array.array("i")
    data, ancdata, _flags, _addr = sock.recvmsg(
        MAX_PACKET, socket.CMSG_SPACE(4 * fds.itemsize), socket.MSG_CMSG_CLOEXEC)
    for level, kind, cdata in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(cdata) - len(cdata) % fds.itemsize
            fds.frombytes(cdata[:usable])
    if not data and not fds:
        return None
    for extra in fds[2:]:
        os.close(extra)
    msg = decode(data, fds[0] if fds else None)
    return replace(msg, fd2=fds[1]) if len(fds) > 1 else msg


@dataclass(frozen=True)
class FileStatus:
    """One held file, as ``ensio transfer status`` lists it."""

    path: str
    size: int
    state: str
    component: str
    connection: str
    persist: str
    waiters: int = 0
    sent: int = 0          #: bytes streamed to other hosts
    after_close: int = 0   #: of which after the producer's close
    consumed: str = ""     #: the components that consumed it, comma-separated (keep)


class Client:
    """A Python connection to the staging daemon (``ensio run``, status, stop, tests).

    Speaks exactly what the interposer speaks, so tests can drive the daemon
    without C.
    """

    def __init__(self, socket_path: str | os.PathLike, component: str = "ensio",
                 timeout: float | None = 30.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(os.fspath(socket_path))
        except OSError as exc:
            self.sock.close()
            raise DaemonUnavailable(exc.errno or errno.ECONNREFUSED,
                                    f"no staging daemon at {os.fspath(socket_path)} "
                                    f"({exc.strerror})") from None
        reply = self.request(encode("HELLO", component=component, pid=os.getpid(),
                                    proto=PROTOCOL_VERSION))
        if reply.verb != "OK":
            self.close()
            raise DaemonUnavailable(errno.EPROTO, f"staging daemon refused: {reply.verb}")
        self.daemon_pid = reply.int("pid")

    def request(self, data: bytes, fd: int | None = None) -> Message:
        """Send a packet and return the reply (DaemonUnavailable if the daemon is gone)."""
        try:
            send_message(self.sock, data, fd)
            reply = recv_message(self.sock)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise DaemonUnavailable(exc.errno, _CLOSED) from None
        if reply is None:
            raise DaemonUnavailable(errno.ECONNRESET, _CLOSED)
        return reply

    def status(self) -> list[FileStatus]:
        """The files the daemon holds."""
        send_message(self.sock, encode("STATUS"))
        return list(self._status_lines())

    def _status_lines(self) -> Iterator[FileStatus]:
        while True:
            msg = recv_message(self.sock)
            if msg is None:
                raise DaemonUnavailable(errno.ECONNRESET, _CLOSED)
            if msg.verb == "END":
                return
            yield FileStatus(path=msg.get("path"), size=msg.int("size"), state=msg.get("state"),
                             component=msg.get("component"), connection=msg.get("conn"),
                             persist=msg.get("persist"), waiters=msg.int("waiters"),
                             sent=msg.int("sent"), after_close=msg.int("after_close"),
                             consumed=msg.get("consumed", ""))

    def stop(self) -> None:
        """Ask the daemon to exit."""
        self.request(encode("STOP"))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
