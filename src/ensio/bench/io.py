"""``ensio bench io``: parallel ensemble I/O against the raw limit and a naive scheme.

Why three measurements in one run: a throughput figure alone says nothing
about whether the implementation is good. Every repeat therefore measures, on
the same files and the same byte ranges, interleaved so that drift of the
machine affects all three alike:

1. **ensio** — one ensemble-I/O object (:func:`ensio.io.modes.ensemble.open_ensemble`,
   built once, before the first repeat, as a run builds it once) reads into
   the distributed matrix, then writes the same block back in place (an
   identity analysis; journal and fsync as configured);
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

The baselines live in :mod:`ensio.bench.io_baselines`.

**Per-file cost** (``per_file_us``): what one member file costs one process
before its data move — open and metadata. Each repeat also times ensio's
metadata pass over all files on its own, as a run sees it when the model
has written new members (the ensemble-I/O object forgets what it checked,
then checks every member again, spread over the ranks): ``per_file_us`` is
the best, over repeats, of the slowest rank's seconds per file it checked;
``metadata_seconds`` the wall time of the whole pass; ``quick_checked`` the
fraction of files accepted by the quick check (:mod:`ensio.io.scan.quickcheck`).
Tiled members (``{tile}``) have the same pass over their tile files
(:class:`~ensio.io.scan.tilescan.TileScan`, one quick-check template per tile
index), so ``per_file_us`` is per tile file; an ensemble-I/O object without
a scan is timed opening and describing each tile
(:func:`ensio.io.formats.open.open_member`). The naive scheme is not run for tiled
members (it reads whole member files).

Timing: every measurement starts after a barrier and ends when the slowest
rank returns (maximum over ranks). The figure used is the **best** (minimum
time) of the repeats, per measurement; all samples are kept in the JSON.
Throughput is in GB/s of state bytes (GB = 1e9): the on-disk size of the state
entries (``IOStats.state_bytes``) for ensio and the naive scheme, and the bytes
actually moved for the raw limit (whole variables; equal unless a variable is
masked).

Shared machines: with more runnable processes than cores, a rank that is
preempted resumes only at a scheduler tick (4 ms at ``CONFIG_HZ=250``), and
a collective waits for its slowest rank. ensio's times then come in steps of
the tick (8.1, 12.1, 16.0 ms ...) while the one-process raw limit, which
needs no second process, does not: small-member ratios measured on a loaded
machine say more about the scheduler than about ensio. ``ratio_raw_median``
(the ratio of the median repeats) is reported beside the best-of-repeats
``ratio_raw``; compare both on a quiet machine.

Page cache: dropping it needs root, so it is not dropped. Instead all member
files are read once before the first repeat, so all three schemes see files
that are hot in the page cache alike; the numbers are therefore memory and
system-call bandwidth, not disk bandwidth.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from mpi4py import MPI
from rich.table import Table

from ..config.schema import Config, EnsembleSection, IOSection
from ..io.formats.open import open_member
from ..io.scan.memberfiles import member_files
from ..io.txn.commit import ensemble_lock
from ..io.txn.journal import journal_root
from ..locks import command_line
from ..parallel.agree import root_call
from .io_baselines import (
    RawRanges,
    naive_read,
    naive_write,
    raw_append,
    raw_ranges,
    raw_read,
    raw_write,
    warm_page_cache,
)
from .machine import describe_machine

__all__ = ["Opener", "RawRanges", "bench_io", "naive_read", "naive_write", "raw_ranges",
           "result_table"]

#: Builds the ensemble-I/O object measured: ``(paths, ensemble, io, comm)`` →
#: an object with ``read(out=, overlap=)``, ``write(block, overlap=, journal=)``,
#: ``stats``, ``n_io`` and ``close()`` (:func:`ensio.io.modes.ensemble.open_ensemble`).
Opener = Callable[[Sequence[Path], EnsembleSection, IOSection, MPI.Comm], Any]
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


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(memoryview(np.ascontiguousarray(a)).cast("B")).hexdigest()


@dataclass
class _Run:
    """One benchmark run: what is measured, and the samples so far."""

    config: Config
    comm: MPI.Comm
    ens: Any
    raw: RawRanges | None
    measure_overlap: bool
    step: Callable[[str], None]
    samples: dict[str, list[float]] = field(
        default_factory=lambda: {n: [] for n in ("ensio_read", "ensio_write", "raw_read",
                                                 "raw_write", "naive_read", "naive_write")}
    )
    stats: dict[str, list[Any]] = field(default_factory=lambda: {"read": [], "write": []})
    verified: bool | None = None
    prev: Any = None
    quick: float | None = None

    def add(self, name: str, seconds: float) -> None:
        self.samples.setdefault(name, []).append(seconds)

    def ensio(self, tag: str) -> Any:
        """ensio's read and write (and their variants); returns the block read."""
        comm, ens = self.comm, self.ens
        self.step(f"{tag}: ensio read")
        # Repeats after the first read into the previous matrix, as a cycling
        # filter does: the first-touch cost of a fresh array is not I/O.
        t, block = _timed(comm, lambda: ens.read(out=self.prev))
        self.add("ensio_read", t)
        self.stats["read"].append(ens.stats)
        self.step(f"{tag}: ensio write")
        t, wstats = _timed(comm, lambda: ens.write(block))
        self.add("ensio_write", t)
        self.stats["write"].append(wstats)
        self.prev = block
        if self.config.io.journal:
            # The same write without the journal: the journal's extra cost.
            self.step(f"{tag}: ensio write without journal")
            self.add("unjournaled_write", _timed(comm, lambda: ens.write(block, journal=False))[0])
        if self.measure_overlap:
            # The same scheme without overlap (read/scatter and gather/write in
            # turn): what the reader/writer threads gain.
            self.step(f"{tag}: ensio without overlap")
            t, _ = _timed(comm, lambda: ens.read(out=block, overlap=False))
            self.add("sequential_read", t)
            self.add("sequential_write", _timed(comm, lambda: ens.write(block, overlap=False))[0])
        return block

    def per_file(self, tag: str, paths: Sequence[Path]) -> None:
        """Open + metadata per file (module docstring); one sample per repeat."""
        comm, ens = self.comm, self.ens
        self.step(f"{tag}: metadata pass")
        scan = getattr(ens, "scan", None)
        if scan is not None:

            def again() -> tuple[float, int, int]:
                scan.invalidate()
                scan.refresh()
                return scan.seconds, scan.checked, scan.quick

            t, (seconds, checked, quick) = _timed(comm, again)
        else:
            t, (seconds, checked, quick) = _timed(comm, lambda: _open_tiles(paths, comm))
        self.add("metadata", t)
        self.add("per_file", comm.allreduce(seconds / max(checked, 1), op=MPI.MAX))
        self.quick = comm.allreduce(quick) / max(comm.allreduce(checked), 1)

    def raw_limit(self, tag: str) -> None:
        """The raw limit on rank 0 (and one extra write of the bytes, with a journal)."""
        raw, comm, fsync = self.raw, self.comm, self.config.io.fsync
        if raw is None:
            return
        self.step(f"{tag}: raw read")
        buf = np.empty(raw.nbytes if comm.rank == 0 else 0, dtype=np.uint8)
        buf.fill(0)  # touch the pages outside the timing: the raw limit is a best case
        self.add("raw_read", _root_timed(comm, lambda: raw_read(raw, buf)))
        self.step(f"{tag}: raw write")
        self.add("raw_write", _root_timed(comm, lambda: raw_write(raw, buf, fsync)))
        if self.config.io.journal:
            self.step(f"{tag}: one extra write of the state bytes")
            self.add("extra_write", _root_timed(comm, lambda: raw_append(raw, buf, fsync)))

    def naive(self, tag: str, layout: Any, digest: str | None) -> None:
        """The naive scheme; the first repeat also checks ensio's matrix against it."""
        if self.config.ensemble.tiled:
            return  # it reads whole member files
        comm, paths = self.comm, self.config.member_paths()
        self.step(f"{tag}: naive read")
        t, data = _timed(comm, lambda: naive_read(paths, comm, layout))
        self.add("naive_read", t)
        if digest is not None:
            self.verified = bool(comm.allreduce(_digest(data) == digest, op=MPI.LAND))
        self.step(f"{tag}: naive write")
        fsync = self.config.io.fsync
        self.add("naive_write", _timed(comm, lambda: naive_write(paths, comm, layout, data,
                                                                 fsync))[0])


def bench_io(
    config: Config,
    comm: MPI.Comm,
    repeat: int = 3,
    opener: Opener | None = None,
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
    opener : callable, optional
        Replaces :func:`~ensio.io.modes.ensemble.open_ensemble` (tests use stand-ins);
        the no-overlap variant is measured only with the real one.
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
    step = on_step if (on_step is not None and comm.rank == 0) else (lambda _label: None)
    tiled = config.ensemble.tiled
    paths = root_call(comm, lambda: member_files(config.ensemble, config.base_dir))
    names = [v.name for v in config.ensemble.variables]

    def prepare() -> RawRanges | None:
        warm_page_cache(paths)
        return raw_ranges(paths, names)

    raw = root_call(comm, prepare)
    real = opener is None
    if opener is None and tiled:
        from ..io.modes.tiledio import TiledEnsembleIO

        def opener(_p: Sequence[Path], ens: EnsembleSection, io: IOSection, c: MPI.Comm) -> Any:
            return TiledEnsembleIO(ens, config.base_dir, io, c)
    elif opener is None:
        from ..io.modes.ensemble import open_ensemble as opener
    # it writes the members (in place, identity): under their lock, like any writer
    with ensemble_lock(journal_root(paths[0]), comm, command_line()), \
            opener(paths, config.ensemble, config.io, comm) as ens:
        run = _Run(config, comm, ens, raw, real and ens.n_io < comm.size, step)
        for r in range(1, repeat + 1):
            tag = f"repeat {r}/{repeat}"
            block = run.ensio(tag)
            digest = _digest(block.data) if r == 1 else None
            run.per_file(tag, paths)
            run.raw_limit(tag)
            run.naive(tag, block.layout, digest)
        n_io = ens.n_io
    state_bytes = int(run.stats["read"][0].state_bytes) or _state_bytes(block)
    per_file = run.samples.pop("per_file")
    head = {
        "benchmark": "io",
        "n_mpi": comm.size,
        "n_io": n_io,
        "members": config.ensemble.size,
        "files": len(paths),
        "tiled": tiled,
        "per_file_us": min(per_file) * 1e6,
        "per_file_samples_us": [x * 1e6 for x in per_file],
        "metadata_seconds": min(run.samples["metadata"]),
        "quick_checked": run.quick,
        "variables": names,
        "n_rows": int(block.layout.n_rows),
        "state_bytes": state_bytes,
        "raw_bytes": raw.nbytes if raw is not None else None,
        "journal": config.io.journal,
        "fsync": config.io.fsync,
        "repeat": repeat,
        "statistic": "best (minimum time) of the repeats, per measurement",
        "verified": run.verified,
        "page_cache": PAGE_CACHE_NOTE,
        **_variants(run.samples, run.measure_overlap),
    }
    return _summarise(
        samples=run.samples, stats=run.stats, state_bytes=state_bytes,
        raw_bytes=raw.nbytes if raw is not None else None, head=head, data_dir=paths[0].parent,
    )  # fmt: skip


def _open_tiles(paths: Sequence[Path], comm: MPI.Comm) -> tuple[float, int, int]:
    """This rank's share of the tile files, opened and described as the tiled reader does.

    Returns (seconds, files, 0): the tiled reader has no quick check.
    """
    mine = list(paths)[comm.rank :: comm.size]
    t0 = time.perf_counter()
    for path in mine:
        with open_member(path) as store:
            store.variables()
    return time.perf_counter() - t0, len(mine), 0


def _state_bytes(block: Any) -> int:
    """On-disk bytes of the state entries, all members (for objects whose stats lack them)."""
    per_member = sum(v.size * v.dtype.itemsize for v in block.layout.variables)
    return int(per_member * block.data.shape[0])


def _variants(samples: dict[str, list[float]], measure_overlap: bool) -> dict[str, Any]:
    """``overlap`` and ``journal_cost`` of the result; pops their raw samples."""
    journal_cost = None
    if "unjournaled_write" in samples:
        extra = _best(samples["ensio_write"]) - _best(samples.pop("unjournaled_write"))
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
    return {"overlap": overlap, "journal_cost": journal_cost}


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
    out["median_seconds"] = med = {k: statistics.median(v) for k, v in samples.items() if v}
    # the same ratio from the median repeat: steadier on a shared machine (module docstring)
    ours, raw = (med.get(f"{p}_read", 0.0) + med.get(f"{p}_write", 0.0) for p in ("ensio", "raw"))
    out["ratio_raw_median"] = _ratio(_gbps(2 * state_bytes, ours),
                                     _gbps(2 * raw_bytes if raw_bytes else None, raw))
    machine = describe_machine(data_dir)
    out["timestamp"] = machine.pop("timestamp")
    out["machine"] = machine
    return out


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "—" if x is None else format(x, spec)


def result_table(res: dict[str, Any]) -> Table:
    """A rich table of a :func:`bench_io` result: one column per direction (fits 80 columns)."""
    title = (
        f"ensio bench io: {res['members']} members"
        f"{' in ' + str(res['files']) + ' tile files' if res.get('tiled') else ''}, "
        f"{res['state_bytes'] / 1e9:.3g} GB of state, "
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
    rows.append(("per-file µs (open+metadata)", res.get("per_file_us"), None, None, ".0f"))
    rows.append(("metadata pass s", res.get("metadata_seconds"), None, None, ".4f"))
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
