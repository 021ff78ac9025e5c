"""The client/server wire protocol: message header, kinds, tags, field table, report.

Why one module: the Python client, the Python server and the C client
(``csrc/ensio_ioclient.c``) must agree byte for byte. Every client-to-server
message is ONE ``MPI_BYTE`` message with tag :data:`TAG_MSG` on the duplicated
world communicator: a 128-byte header (native byte order, twelve int64 words
then a 32-byte NUL-padded name — the C struct ``ensio_msg_header``) followed by
the payload. One message per send keeps the per-source order MPI guarantees,
which is what lets a server conclude "every field of step s arrived" from a
client's STEP s+1.

Restart kinds (seed 003, :mod:`.restart`): a model rank sends, to the server
that owns restart ``rid`` (``servers[rid % S]``), ``RESTART_BEGIN`` (``a[0]``
= rid; TEXT payload: the JSON of :class:`~.restart.RestartMeta`), then one
``RESTART_PART`` per non-empty block (``a[0]`` = rid, ``a[1]`` = ndim,
``name`` = the variable; payload of ``2*ndim + block.size`` elements, F64 or
F32: the block's global ``starts`` (ndim), its ``counts`` (ndim), then the
block in C order — index values are exact in float32 below 2**24, beyond that
the part is sent as F64), then ``RESTART_END`` (``a[0]`` = rid, ``a[1]`` = number of
parts sent, informational). Every model rank sends BEGIN and END, with or without
parts; the server writes the file at the last END (:mod:`.restart`).

Server-to-client messages are text (``MPI_CHAR``): the field table
(:data:`TAG_TABLE`), the report (:data:`TAG_REPORT`) and errors
(:data:`TAG_ERROR`).

The setup handshake (collective over the world, Python and C alike) carries
every rank's verdict, so that an error found anywhere ends the whole job with
one line instead of leaving the others in a collective: step 1 is an
``MPI_Allgather`` of one int per rank, a :class:`Status` (server role, "my
setup failed", "I print the job's setup error" — the C client does, its
model's log is where a modeller looks). If any rank failed, the lowest failed
rank sends its one-line reason (``VERDICT_ERROR`` + text, tag
:data:`TAG_TABLE`, on the duplicated world) to every other rank, the printer
(the lowest C client, else the failed rank itself if it is a server) prints
``ensio ioserver: error: <text>``, every rank meets in ``MPI_Barrier(world)``
(the line is out before anyone exits) and exits with status 2. Otherwise the
first server sends the field table, or ``VERDICT_ERROR`` + text when planning
failed (then the same printing and barrier).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import EnsioError

__all__ = [
    "IOServerError",
    "MAGIC",
    "HEADER_BYTES",
    "HEADER_DTYPE",
    "TAG_MSG",
    "TAG_TABLE",
    "TAG_REPORT",
    "TAG_ERROR",
    "DRAIN_SECONDS",
    "Status",
    "VERDICT_ERROR",
    "TIMEOUT_ENV",
    "Kind",
    "DType",
    "Flags",
    "Header",
    "ProtocolError",
    "encode",
    "decode",
    "FieldEntry",
    "FieldTable",
    "format_table",
    "parse_table",
    "format_pairs",
    "parse_pairs",
    "timestep_seconds",
    "restart_part",
    "split_restart_part",
]

#: ``"ENSIOIO1"`` read as a little-endian int64.
MAGIC = 0x314F494F49534E45
HEADER_BYTES = 128
TAG_MSG = 7701
TAG_TABLE = 7702
TAG_REPORT = 7703
TAG_ERROR = 7704

#: How long a server keeps receiving after a model rank failed, when the other
#: ranks stop sending (they may hang in a collective with the dead rank); the
#: failed rank waits for the servers' verdict a little longer than this.
DRAIN_SECONDS = 20.0

NAME_BYTES = 32

#: A failed setup's text on the table's tag: this prefix, then one line.
VERDICT_ERROR = "ensio-ioserver error "

#: The C client's override of ``ioserver.timeout_s`` (seconds; the table's value otherwise).
TIMEOUT_ENV = "ENSIO_IOSERVER_TIMEOUT"


class Status(enum.IntFlag):
    """Each rank's word in the handshake's ``MPI_Allgather`` (a plain C int)."""

    SERVER = 1
    ERROR = 2
    PRINTS = 4

#: The C struct, field by field (native byte order, like the C client writes it).
HEADER_DTYPE = np.dtype([
    ("magic", "=i8"), ("kind", "=i8"), ("step", "=i8"), ("dtype", "=i8"),
    ("count", "=i8"), ("a", "=i8", (7,)), ("name", f"S{NAME_BYTES}"),
])
assert HEADER_DTYPE.itemsize == HEADER_BYTES


class ProtocolError(ValueError):
    """A message that does not follow the protocol (bad magic, kind, size or name)."""


class Kind(enum.IntEnum):
    """Message kinds (``header.kind``)."""

    DOMAIN = 1
    FIELD = 2
    STEP = 3
    CLOSE = 4
    ABORT = 5
    DEFINED = 6
    RESTART_BEGIN = 7
    RESTART_PART = 8
    RESTART_END = 9


class DType(enum.IntEnum):
    """Payload element types (``header.dtype``)."""

    F64 = 0
    F32 = 1
    TEXT = 3


class Flags(enum.IntFlag):
    """Which optional arrays a DOMAIN message carries (``a[5]``), in payload order."""

    LONLAT = 1
    BOUNDS = 2
    MASK = 4
    AREA = 8


_NUMPY = {DType.F64: np.dtype("=f8"), DType.F32: np.dtype("=f4"), DType.TEXT: np.dtype("u1")}
_CODES = {np.dtype("f8"): DType.F64, np.dtype("f4"): DType.F32}


@dataclass(frozen=True)
class Header:
    """A decoded header; ``a`` holds the seven kind-specific words."""

    kind: Kind
    step: int = 0
    dtype: DType = DType.F64
    count: int = 0
    a: tuple[int, ...] = (0,) * 7
    name: str = ""


def encode(header: Header, payload: np.ndarray | bytes | None = None) -> np.ndarray:
    """One message (``uint8`` array): the 128-byte header, then a copy of the payload.

    The copy is the client's buffer: the caller may reuse ``payload`` at once.
    ``header.count`` and ``header.dtype`` are taken from the payload when it is
    an array (float32/float64) or bytes (text).
    """
    if isinstance(payload, (bytes, bytearray, str)):
        raw = payload.encode() if isinstance(payload, str) else bytes(payload)
        data = np.frombuffer(raw, dtype=np.uint8)
        dtype, count = DType.TEXT, data.size
    elif payload is None:
        data = np.empty(0, np.uint8)
        dtype, count = header.dtype, header.count
    else:
        data = np.asarray(payload)  # any layout and byte order: copied once, below
        code = _CODES.get(data.dtype.newbyteorder("="))
        if code is None:
            raise ProtocolError(f"payload dtype {data.dtype} is not float32 or float64")
        dtype, count = code, data.size
    name = header.name.encode()
    if len(name) > NAME_BYTES:
        raise ProtocolError(f"name {header.name!r} is longer than {NAME_BYTES} bytes")
    a = tuple(header.a) + (0,) * (7 - len(header.a))
    if len(a) != 7:
        raise ProtocolError(f"a has {len(header.a)} words, at most 7")
    msg = np.empty(HEADER_BYTES + data.nbytes, np.uint8)
    head = msg[:HEADER_BYTES].view(HEADER_DTYPE)
    head[0] = (MAGIC, int(header.kind), header.step, int(dtype), count, a, name)
    if data.nbytes:
        msg[HEADER_BYTES:].view(_NUMPY[dtype]).reshape(data.shape)[...] = data
    return msg


def decode(msg: np.ndarray | bytes | bytearray | memoryview) -> tuple[Header, np.ndarray]:
    """Header and payload (a view: float64/float32 array, or ``uint8`` for text)."""
    buf = np.frombuffer(msg, dtype=np.uint8) if not isinstance(msg, np.ndarray) else msg
    if buf.size < HEADER_BYTES:
        raise ProtocolError(f"message of {buf.size} bytes is shorter than the header")
    h = buf[:HEADER_BYTES].view(HEADER_DTYPE)[0]
    if int(h["magic"]) != MAGIC:
        raise ProtocolError(f"bad magic {int(h['magic']):#x} (not an ensio ioserver message)")
    try:
        kind, dtype = Kind(int(h["kind"])), DType(int(h["dtype"]))
    except ValueError as exc:
        raise ProtocolError(f"bad header: {exc}") from None
    count = int(h["count"])
    np_type = _NUMPY[dtype]
    if count < 0 or buf.size - HEADER_BYTES != count * np_type.itemsize:
        raise ProtocolError(
            f"{kind.name} message: {buf.size - HEADER_BYTES} payload bytes for "
            f"{count} elements of {np_type.itemsize} bytes"
        )
    try:
        name = bytes(h["name"]).rstrip(b"\0").decode()
    except UnicodeDecodeError:
        raise ProtocolError("bad header: name is not UTF-8") from None
    header = Header(kind, int(h["step"]), dtype, count, tuple(int(x) for x in h["a"]), name)
    payload = buf[HEADER_BYTES:]
    return header, (payload if dtype == DType.TEXT else payload.view(np_type))


# --------------------------------------------------------------------------- restarts

_F32_EXACT = 2**24


def restart_part(rid: int, variable: str, start: Sequence[int], block: np.ndarray
                 ) -> np.ndarray:
    """The ``RESTART_PART`` message of one block (see the module docstring)."""
    block = np.asarray(block)
    wire = np.dtype("f4") if (block.dtype == np.float32 and max(
        (*start, *block.shape), default=0) < _F32_EXACT) else np.dtype("f8")
    payload = np.empty(2 * block.ndim + block.size, wire)
    payload[:block.ndim] = start
    payload[block.ndim:2 * block.ndim] = block.shape
    payload[2 * block.ndim:] = block.reshape(-1)
    return encode(Header(Kind.RESTART_PART, a=(rid, block.ndim), name=variable), payload)


def split_restart_part(header: Header, payload: np.ndarray
                       ) -> tuple[tuple[int, ...], np.ndarray]:
    """Inverse of :func:`restart_part`: the block's start and the block (a view)."""
    ndim = header.a[1]
    if header.dtype == DType.TEXT or ndim < 0 or payload.size < 2 * ndim:
        raise ProtocolError(f"RESTART_PART of {header.name!r}: {payload.size} elements do not "
                            f"hold {ndim} starts and counts")
    start = tuple(int(x) for x in payload[:ndim])
    counts = tuple(int(x) for x in payload[ndim:2 * ndim])
    if any(c < 0 for c in counts) or int(np.prod(counts)) != payload.size - 2 * ndim:
        raise ProtocolError(f"RESTART_PART of {header.name!r}: counts {counts} do not match "
                            f"{payload.size - 2 * ndim} values")
    return start, payload[2 * ndim:].reshape(counts)


# --------------------------------------------------------------------------- field table

_SECONDS = {"s": 1, "mi": 60, "h": 3600, "d": 86400}


def timestep_seconds(freq: str) -> int:
    """Seconds of a fixed-duration frequency such as ``"1h"`` (the calendar's time step)."""
    for unit in ("mi", "s", "h", "d"):
        if freq.endswith(unit) and freq[: -len(unit)].isdigit():
            return int(freq[: -len(unit)]) * _SECONDS[unit]
    raise ProtocolError(f"{freq!r} is not a fixed duration")


@dataclass(frozen=True)
class FieldEntry:
    """One source field of the table: its grid, the servers it goes to, when it is needed."""

    grid: str
    servers: tuple[int, ...]
    periods: tuple[int, ...]

    def is_active(self, step: int) -> bool:
        """Whether a model must send the field at ``step`` (any period divides it)."""
        return bool(self.servers) and any(step % p == 0 for p in self.periods)


@dataclass(frozen=True)
class FieldTable:
    """What a client learns from the first server: the calendar, geometry sizes, fields.

    ``domains`` maps id to ``(type, ni_glo, nj_glo, nvertex)`` (nvertex 0 when
    unset); ``axes`` id to ``n``; ``grids`` id to ``(domain, axis or None)``;
    ``timeout_s`` is ``ioserver.timeout_s`` (a ``timeout`` record).
    """

    calendar: tuple[str, str, int]
    domains: Mapping[str, tuple[str, int, int, int]]
    axes: Mapping[str, int]
    grids: Mapping[str, tuple[str, str | None]]
    fields: Mapping[str, FieldEntry]
    timeout_s: float = 300.0


def _ints(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values) if values else "-"


def format_table(t: FieldTable) -> str:
    """The table as the text the C client parses (one record per line)."""
    ctype, start, dt = t.calendar
    lines = ["ensio-ioserver 1", f"calendar {ctype} {start.replace(' ', 'T')} {dt}",
             f"timeout {float(t.timeout_s)!r}"]
    lines += [f"domain {i} {d[0]} {d[1]} {d[2]} {d[3]}" for i, d in t.domains.items()]
    lines += [f"axis {i} {n}" for i, n in t.axes.items()]
    lines += [f"grid {i} {g[0]} {g[1] or '-'}" for i, g in t.grids.items()]
    lines += [f"field {i} {f.grid} {_ints(f.servers)} {_ints(f.periods)}"
              for i, f in t.fields.items()]
    return "\n".join([*lines, "end"]) + "\n"


def _parse_ints(text: str) -> tuple[int, ...]:
    return () if text == "-" else tuple(int(x) for x in text.split(","))


def parse_table(text: str) -> FieldTable:
    """Inverse of :func:`format_table`; :class:`ProtocolError` on anything malformed."""
    lines = text.strip().splitlines()
    if not lines or lines[0].strip() != "ensio-ioserver 1" or lines[-1].strip() != "end":
        raise ProtocolError("field table: missing 'ensio-ioserver 1' header or 'end'")
    calendar: tuple[str, str, int] | None = None
    domains: dict[str, tuple[str, int, int, int]] = {}
    axes: dict[str, int] = {}
    grids: dict[str, tuple[str, str | None]] = {}
    fields: dict[str, FieldEntry] = {}
    timeout = 300.0
    for n, line in enumerate(lines[1:-1], start=2):
        w = line.split()
        try:
            if w[0] == "calendar" and len(w) == 4:
                calendar = (w[1], w[2].replace("T", " "), int(w[3]))
            elif w[0] == "domain" and len(w) == 6:
                domains[w[1]] = (w[2], int(w[3]), int(w[4]), int(w[5]))
            elif w[0] == "timeout" and len(w) == 2:
                timeout = float(w[1])
            elif w[0] == "axis" and len(w) == 3:
                axes[w[1]] = int(w[2])
            elif w[0] == "grid" and len(w) == 4:
                grids[w[1]] = (w[2], None if w[3] == "-" else w[3])
            elif w[0] == "field" and len(w) == 5:
                fields[w[1]] = FieldEntry(w[2], _parse_ints(w[3]), _parse_ints(w[4]))
            else:
                raise ValueError("unknown record")
        except (ValueError, IndexError):
            raise ProtocolError(f"field table line {n}: cannot parse {line!r}") from None
    if calendar is None:
        raise ProtocolError("field table: no calendar line")
    return FieldTable(calendar, domains, axes, grids, fields, timeout)


def format_pairs(values: Mapping[str, float | int]) -> str:
    """``key value`` lines (the report of tag 7703)."""
    return "".join(f"{k} {float(v)!r}\n" for k, v in values.items())


def parse_pairs(text: str) -> dict[str, float]:
    """Inverse of :func:`format_pairs` (values as floats)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.strip():
            key, _, value = line.partition(" ")
            out[key] = float(value)
    return out


class IOServerError(EnsioError):
    """A client-side error of the I/O server (bad field id or shape, a server's verdict).

    The message names the field and the model rank, in one line.
    """
