"""``ensio bench io``: parallel ensemble I/O against the raw limit and a naive scheme.

Why three measurements in one run: a throughput figure alone says nothing
about whether the implementation is good. Every repeat therefore measures, on
the same files and the same byte ranges, interleaved so that drift of the
machine affects all three alike:

1. **ensio** — :func:`ensio.io.ensemble.read_ensemble` into the distributed
   matrix, then :func:`~ensio.io.ensemble.write_ensemble` of the same block
   back in place (an identity analysis; journal and fsync as configured);
2. **raw limit** — rank 0 alone does plain sequential ``os.preadv`` of exactly
   the state variables' byte ranges of every member, then ``os.pwritev`` of the
   same bytes back: no MPI, no netCDF, no dtype conversion. One process
   streaming bytes through the page cache is what a single node's file-system
   client can do without parallelism; a ratio ≥ 1 means ensio's parallel
   readers beat one stream;
3. **naive** — rank 0 opens each member with the netCDF4 library, reads the
   state variables and ``Scatterv``s the rows to all ranks (contiguous block
   distribution); writing is ``Gatherv`` to rank 0, then a netCDF4 write. This
   is the one-reader-then-scatter scheme of DART and Miyoshi's LETKF.

Timing: every measurement starts after a barrier and ends when the slowest
rank returns (maximum over ranks). The figure used is the **best** (minimum
time) of the repeats, per measurement; all samples are kept in the JSON.
Throughput is in GB/s of state bytes (GB = 1e9): the on-disk size of the state
entries (``IOStats.state_bytes``) for ensio and the naive scheme, and the bytes
actually moved for the raw limit (whole variables; equal unless a variable is
masked).

Page cache: dropping it needs root, so it is not dropped. Instead all member
files are read once before the first repeat, so all three schemes see files
that are hot in the page cache alike; the numbers are therefore memory and
system-call bandwidth, not disk bandwidth.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import netCDF4
import numpy as np
from mpi4py import MPI
from rich.table import Table

from ..config.schema import Config
from ..durable import fsync_path
from ..errors import InputError
from ..parallel.agree import ErrorNote, note_error, raise_if_any, root_call
from ..parallel.distribution import block_distribution
from .machine import describe_machine

__all__ = ["RawRanges", "bench_io", "naive_read", "naive_write", "raw_ranges", "result_table"]

Reader = Callable[[Config, MPI.Comm], Any]
Writer = Callable[[Config, MPI.Comm, Any], Any]
T = TypeVar("T")

#: IOStats field → name of the part in reports.
BREAKDOWN = {
    "read_seconds": "reading",
    "write_seconds": "writing",
    "comm_seconds": "communication",
    "wait_seconds": "waiting",
    "journal_seconds": "journal",
    "total_seconds": "total",
}
PAGE_CACHE_NOTE = (
    "page cache not dropped (needs root); all member files are read once before the "
    "first repeat, so ensio, raw and naive all see hot files"
)
_CHUNK = 1 << 24


@dataclass(frozen=True)
class RawRanges:
    """Byte ranges ``(offset, nbytes)`` of the state variables, per member file."""

    paths: tuple[Path, ...]
    ranges: tuple[tuple[tuple[int, int], ...], ...]

    @property
    def nbytes(self) -> int:
        return sum(n for rs in self.ranges for _, n in rs)


def raw_ranges(config: Config) -> RawRanges | None:
    """The state variables' byte ranges in every member (``None`` if one has no raw offset).

    Offsets come from :func:`ensio.io.open.open_member` (HDF5 dataset offset,
    classic ``begin``), the same metadata the real implementation uses. Ranges
    are sorted by offset so the raw limit reads each file front to back.
    """
    from ..io.open import open_member

    names = [v.name for v in config.ensemble.variables]
    ranges = []
    paths = config.member_paths()
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


def _distribution(n_rows: int, comm: MPI.Comm) -> tuple[np.ndarray, np.ndarray]:
    bounds = [block_distribution(n_rows, comm.size, r) for r in range(comm.size)]
    return (np.array([c for _, c in bounds], dtype=np.int64),
            np.array([s for s, _ in bounds], dtype=np.int64))


def naive_read(config: Config, comm: MPI.Comm, layout: Any) -> np.ndarray:
    """Collective: rank 0 reads each member with netCDF4 and scatters its rows.

    Returns this rank's ``(N_e, count)`` float64 block, same distribution as ensio's.
    """
    counts, displs = _distribution(layout.n_rows, comm)
    data = np.empty((config.ensemble.size, int(counts[comm.rank])), dtype=np.float64)
    vec = np.empty(layout.n_rows, dtype=np.float64) if comm.rank == 0 else None
    err: ErrorNote = None
    for m, path in enumerate(config.member_paths()):
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


def naive_write(config: Config, comm: MPI.Comm, layout: Any, data: np.ndarray) -> None:
    """Collective: gather each member's rows to rank 0, which writes them with netCDF4."""
    counts, displs = _distribution(layout.n_rows, comm)
    vec = np.empty(layout.n_rows, dtype=np.float64) if comm.rank == 0 else None
    err: ErrorNote = None
    for m, path in enumerate(config.member_paths()):
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
            if config.io.fsync:
                fsync_path(path)
        except Exception as exc:  # raised on every rank below: nobody hangs
            err = note_error(RuntimeError(f"naive write of {path}: {exc}"))
    raise_if_any(comm, err)


def _timed(comm: MPI.Comm, fn: Callable[[], T]) -> tuple[float, T]:
    """Run collective ``fn`` between a barrier and the slowest rank's return."""
    comm.Barrier()
    t0 = time.perf_counter()
    out = fn()
    dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    return dt, out


def _root_timed(comm: MPI.Comm, fn: Callable[[], None]) -> float:
    """Run ``fn`` on rank 0 alone (the others wait); its seconds, on every rank."""

    def timed() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    comm.Barrier()
    return float(root_call(comm, timed))


def _warm_page_cache(paths: Sequence[Path]) -> None:
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


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(memoryview(np.ascontiguousarray(a)).cast("B")).hexdigest()


def _default_io() -> tuple[Reader, Writer]:
    from ..io.ensemble import read_ensemble, write_ensemble

    return read_ensemble, write_ensemble


def bench_io(
    config: Config,
    comm: MPI.Comm,
    repeat: int = 3,
    reader: Reader | None = None,
    writer: Writer | None = None,
    on_step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Collective: measure ensio's read/write against the raw limit and the naive scheme.

    Parameters
    ----------
    config : Config
        The ensemble to read and write back in place (identity: files keep
        their values; with ``io.journal`` the journal is written and committed).
    comm : MPI.Comm
        Filter communicator (``MPI.COMM_SELF`` for a serial run).
    repeat : int
        Number of repeats; the best (minimum) time of each measurement is used.
    reader, writer : callable, optional
        Replace :func:`~ensio.io.ensemble.read_ensemble` /
        :func:`~ensio.io.ensemble.write_ensemble` (tests use stand-ins).
    on_step : callable, optional
        Called on rank 0 with a label before each measurement (progress display).

    Returns
    -------
    dict
        The JSON-serialisable result, identical on every rank; see
        ``benchmarks/README.md`` for the keys.
    """
    if repeat < 1:
        raise ValueError(f"--repeat must be at least 1, got {repeat}")
    default_io = reader is None or writer is None
    if default_io:
        reader, writer = _default_io()
    step = on_step if (on_step is not None and comm.rank == 0) else (lambda _label: None)

    def prepare() -> RawRanges | None:
        _warm_page_cache(config.member_paths())
        return raw_ranges(config)

    raw = root_call(comm, prepare)

    names = ("ensio_read", "ensio_write", "raw_read", "raw_write", "naive_read", "naive_write")
    samples: dict[str, list[float]] = {n: [] for n in names}
    stats: dict[str, list[Any]] = {"read": [], "write": []}
    verified: bool | None = None
    state_bytes = n_rows = 0
    prev = None
    n_io = config.io.tasks if config.io.tasks is not None else min(comm.size,
                                                                   config.ensemble.size)
    measure_overlap = default_io and n_io < comm.size
    no_journal = dataclasses.replace(config, io=dataclasses.replace(config.io, journal=False))
    for r in range(1, repeat + 1):
        tag = f"repeat {r}/{repeat}"
        step(f"{tag}: ensio read")
        # Repeats after the first read into the previous matrix, as a cycling
        # filter does: the first-touch cost of a fresh array is not I/O.
        t, block = _timed(
            comm, lambda prev=prev: reader(config, comm, **({} if prev is None else {"out": prev}))
        )
        samples["ensio_read"].append(t)
        stats["read"].append(block.stats)
        layout, n_rows = block.layout, block.layout.n_rows
        state_bytes = int(block.stats.state_bytes)
        ours_digest = _digest(block.data) if r == 1 else None
        step(f"{tag}: ensio write")
        t, wstats = _timed(comm, lambda block=block: writer(config, comm, block))
        samples["ensio_write"].append(t)
        stats["write"].append(wstats)
        prev = block
        if config.io.journal:
            # The same write without the journal: the journal's extra cost.
            step(f"{tag}: ensio write without journal")
            t, _ = _timed(comm, lambda b=block: writer(no_journal, comm, b))
            samples.setdefault("unjournaled_write", []).append(t)
        if measure_overlap:
            # The same scheme without overlap (read/scatter and gather/write in
            # turn): what the reader/writer threads gain.
            step(f"{tag}: ensio without overlap")
            t, _ = _timed(comm, lambda b=block: reader(config, comm, out=b, overlap=False))
            samples.setdefault("sequential_read", []).append(t)
            t, _ = _timed(comm, lambda b=block: writer(config, comm, b, overlap=False))
            samples.setdefault("sequential_write", []).append(t)

        if raw is not None:
            step(f"{tag}: raw read")
            buf = np.empty(raw.nbytes if comm.rank == 0 else 0, dtype=np.uint8)
            buf.fill(0)  # touch the pages outside the timing: the raw limit is a best case
            samples["raw_read"].append(_root_timed(comm, lambda buf=buf: raw_read(raw, buf)))
            step(f"{tag}: raw write")
            samples["raw_write"].append(
                _root_timed(comm, lambda buf=buf: raw_write(raw, buf, config.io.fsync))
            )
            if config.io.journal:
                step(f"{tag}: one extra write of the state bytes")
                samples.setdefault("extra_write", []).append(
                    _root_timed(comm, lambda buf=buf: raw_append(raw, buf, config.io.fsync))
                )
            del buf

        step(f"{tag}: naive read")
        t, naive = _timed(comm, lambda layout=layout: naive_read(config, comm, layout))
        samples["naive_read"].append(t)
        if ours_digest is not None:
            verified = bool(comm.allreduce(_digest(naive) == ours_digest, op=MPI.LAND))
        step(f"{tag}: naive write")
        t, _ = _timed(comm, lambda naive=naive, layout=layout:
                      naive_write(config, comm, layout, naive))
        samples["naive_write"].append(t)
        del naive

    journal_cost = None
    if "unjournaled_write" in samples:
        extra = _best(samples.pop("unjournaled_write"))
        extra = _best(samples["ensio_write"]) - extra
        one_write = _best(samples.pop("extra_write", []))
        journal_cost = {
            "extra_seconds": extra,
            "one_extra_write_seconds": one_write,
            "ratio": _ratio(extra, one_write),
            "note": "ensio write with journal minus without, over one sequential write of "
            "the state bytes to a new file (then deleted) by one process; goal <= 1",
        }
    overlap = None
    if measure_overlap:
        overlap = {
            f"{d}_gain": _ratio(_best(samples.pop(f"sequential_{d}")), _best(samples[f"ensio_{d}"]))
            for d in ("read", "write")
        }
        overlap["note"] = "time without overlap / time with (N_io < N_mpi only)"
    return _summarise(
        samples=samples, stats=stats, state_bytes=state_bytes,
        raw_bytes=raw.nbytes if raw is not None else None,
        head={
            "benchmark": "io",
            "n_mpi": comm.size,
            "n_io": n_io,
            "members": config.ensemble.size,
            "variables": [v.name for v in config.ensemble.variables],
            "n_rows": int(n_rows),
            "state_bytes": state_bytes,
            "raw_bytes": raw.nbytes if raw is not None else None,
            "journal": config.io.journal,
            "fsync": config.io.fsync,
            "repeat": repeat,
            "statistic": "best (minimum time) of the repeats, per measurement",
            "verified": verified,
            "page_cache": PAGE_CACHE_NOTE,
            "overlap": overlap,
            "journal_cost": journal_cost,
        },
        data_dir=config.member_paths()[0].parent,
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _gbps(nbytes: int | None, seconds: float | None) -> float | None:
    return None if nbytes is None or not seconds else nbytes / seconds / 1e9


def _best(xs: list[float]) -> float | None:
    return min(xs) if xs else None


def _summarise(
    samples: dict[str, list[float]],
    stats: dict[str, list[Any]],
    state_bytes: int,
    raw_bytes: int | None,
    head: dict[str, Any],
    data_dir: Path,
) -> dict[str, Any]:
    """Best-of-repeats figures per direction and combined (read + write)."""
    out: dict[str, Any] = dict(head)
    sec: dict[str, float | None] = {k: _best(v) for k, v in samples.items()}
    for d in ("read", "write"):
        ours = sec[f"ensio_{d}"]
        best = samples[f"ensio_{d}"].index(ours)  # breakdown of the best repeat
        st = stats[d][best]
        gbps = _gbps(state_bytes, ours)
        raw_gbps = _gbps(raw_bytes, sec[f"raw_{d}"])
        naive_gbps = _gbps(state_bytes, sec[f"naive_{d}"])
        out[d] = {
            "gbps": gbps,
            "seconds": ours,
            "raw_gbps": raw_gbps,
            "raw_seconds": sec[f"raw_{d}"],
            "naive_gbps": naive_gbps,
            "naive_seconds": sec[f"naive_{d}"],
            "ratio_raw": _ratio(gbps, raw_gbps),
            "ratio_naive": _ratio(gbps, naive_gbps),
            "breakdown": {name: float(getattr(st, f)) for f, name in BREAKDOWN.items()},
        }

    def combined(prefix: str, nbytes: int | None) -> float | None:
        r, w = sec[f"{prefix}_read"], sec[f"{prefix}_write"]
        return None if r is None or w is None else _gbps(2 * nbytes if nbytes else None, r + w)

    out["throughput_gbps"] = combined("ensio", state_bytes)
    out["raw_gbps"] = combined("raw", raw_bytes)
    out["naive_gbps"] = combined("naive", state_bytes)
    out["ratio_raw"] = _ratio(out["throughput_gbps"], out["raw_gbps"])
    out["ratio_naive"] = _ratio(out["throughput_gbps"], out["naive_gbps"])
    out["samples_seconds"] = samples
    out["median_seconds"] = {k: statistics.median(v) for k, v in samples.items() if v}
    machine = describe_machine(data_dir)
    out["timestamp"] = machine.pop("timestamp")
    out["machine"] = machine
    return out


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "—" if x is None else format(x, spec)


def result_table(res: dict[str, Any]) -> Table:
    """A rich table of a :func:`bench_io` result: one column per direction (fits 80 columns)."""
    title = (
        f"ensio bench io: {res['members']} members, {res['state_bytes'] / 1e9:.3g} GB of state, "
        f"N_mpi={res['n_mpi']}, N_io={res['n_io']}, journal {'on' if res['journal'] else 'off'}, "
        f"best of {res['repeat']}"
    )
    t = Table(title=title, caption="GB = 1e9 bytes of state; parts: seconds, per-rank maximum; "
              "files hot in the page cache for all three schemes")
    t.add_column("")
    for col in ("read", "write", "read+write"):
        t.add_column(col, justify="right")
    r, w = res["read"], res["write"]
    rows: list[tuple[str, float | None, float | None, float | None, str]] = [
        ("ensio GB/s", r["gbps"], w["gbps"], res["throughput_gbps"], ".2f"),
        ("ensio seconds", r["seconds"], w["seconds"], r["seconds"] + w["seconds"], ".3f"),
    ]
    for name in ("reading", "writing", "communication", "waiting", "journal"):
        rb, wb = r["breakdown"][name], w["breakdown"][name]
        rows.append((f"  {name}", rb, wb, rb + wb, ".3f"))
    rows += [
        ("raw limit GB/s", r["raw_gbps"], w["raw_gbps"], res["raw_gbps"], ".2f"),
        ("naive GB/s", r["naive_gbps"], w["naive_gbps"], res["naive_gbps"], ".2f"),
        ("ensio / raw", r["ratio_raw"], w["ratio_raw"], res["ratio_raw"], ".2f"),
        ("ensio / naive", r["ratio_naive"], w["ratio_naive"], res["ratio_naive"], ".2f"),
    ]
    ov, jc = res.get("overlap"), res.get("journal_cost")
    if ov:
        rows.append(("no-overlap / overlap", ov["read_gain"], ov["write_gain"], None, ".2f"))
    if jc:
        rows.append(("journal extra s", None, jc["extra_seconds"], None, ".3f"))
        rows.append(("  one extra write s", None, jc["one_extra_write_seconds"], None, ".3f"))
        rows.append(("  ratio (goal <= 1)", None, jc["ratio"], None, ".2f"))
    for label, a, b, c, spec in rows:
        bold = "bold" if label.startswith("ensio") and "/" not in label else None
        t.add_row(label, _fmt(a, spec), _fmt(b, spec), _fmt(c, spec), style=bold)
    return t
