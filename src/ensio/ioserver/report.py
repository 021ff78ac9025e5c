"""The performance report ``Client.close()`` returns, and its text form (tag 7703).

Why a report: the point of an I/O server is that the model does not wait for
output, so a run must be able to show how long it did wait (``blocked_seconds``),
how much it sent, how busy the servers were and how much memory they held.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace

from .protocol import format_pairs, parse_pairs

__all__ = ["Report", "SERVER_KEYS", "combine_servers", "server_text", "with_server_text"]

#: The keys the first server sends to every model rank (``key value`` lines).
SERVER_KEYS = ("server_busy_fraction", "server_memory_hwm_bytes", "bytes_written",
               "files_written")


@dataclass(frozen=True)
class Report:
    """What one model rank learns at ``close()``.

    Attributes
    ----------
    blocked_seconds : float
        Time this rank waited because its send buffer was full, plus the final
        flush in ``close`` (server mode); its time in the gathers and writes
        (attached/sync modes). Not the wait for the servers' last writes.
    bytes_sent, messages : int
        Payload bytes and messages this rank sent (server mode; the gathered
        bytes in attached/sync modes).
    server_busy_fraction : float
        Largest fraction of wall time a server spent outside ``MPI_Probe``
        (attached/sync: the output share of the writing rank's time).
    server_memory_hwm_bytes : int
        Largest high-water mark of held field parts (and accumulators) over servers.
    bytes_written, files_written : int
        Totals over all writers.
    """

    blocked_seconds: float = 0.0
    bytes_sent: int = 0
    messages: int = 0
    server_busy_fraction: float = 0.0
    server_memory_hwm_bytes: int = 0
    bytes_written: int = 0
    files_written: int = 0

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def combine_servers(values: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One server summary from each server's: maxima of busy/memory, sums of output."""
    return {
        "server_busy_fraction": max(v["server_busy_fraction"] for v in values),
        "server_memory_hwm_bytes": max(v["server_memory_hwm_bytes"] for v in values),
        "bytes_written": sum(v["bytes_written"] for v in values),
        "files_written": sum(v["files_written"] for v in values),
    }


def server_text(values: Mapping[str, float]) -> str:
    """The tag-7703 text of a server summary."""
    return format_pairs({k: values[k] for k in SERVER_KEYS})


def with_server_text(report: Report, text: str) -> Report:
    """``report`` (the client's own numbers) completed with the servers' text."""
    v = parse_pairs(text)
    return replace(
        report,
        server_busy_fraction=float(v.get("server_busy_fraction", 0.0)),
        server_memory_hwm_bytes=int(v.get("server_memory_hwm_bytes", 0)),
        bytes_written=int(v.get("bytes_written", 0)),
        files_written=int(v.get("files_written", 0)),
    )
