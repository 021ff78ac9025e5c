"""``ensio bench transfer``: handing netCDF-4 files from a producer to a consumer.

Seed 004 reports 7.6–29× the throughput of exchanging files through the parallel
file system. Here a producer process writes N netCDF-4 files of S MiB through the
netCDF library and a consumer process reads every variable of every file through
the netCDF library (decoded arrays, not raw bytes), in each case of
:data:`~.transfer_cases.CASES`: plain files left in the page cache, plain files
fsync'd (with their directory) before the consumer is told, each also with a
consumer that polls for the name instead of being told, and the transfer layer
(``ensio run --transfer``) on one host; async and two network namespaces when the
installed transfer layer supports them, "not measured" otherwise.

The time of a run is from the producer's first write (its first netCDF create) to
the consumer's last byte (the close of the last file after reading it), on the one
monotonic clock of the host. Both programs are started, and the consumer ready,
before that start (:mod:`.transfer_programs`), so interpreter start-up is not timed.
Repeats are interleaved (slow drifts of a shared machine hit every case alike), the
order rotated each round (no case always runs after the same one), and the best
time of each case is reported, as is a ``memcpy`` of the same bytes
(numpy, between two buffers of one file's size, already touched) measured in every
round, best of all. Every run checks that the consumer read exactly the arrays the
producer wrote (SHA-256 per variable): ``verified``.

The headline ratios (issue 28's acceptance) are of medians over the repeats:
``speedup_pagecache`` and ``speedup_fsync`` (the better file exchange / direct),
``limit_ratio`` (direct / the same bytes written into fresh memfds, the floor of any
producer putting a file into memory), ``launch_ms`` (``ensio run --transfer … --
true`` with the daemon running, :func:`launch_seconds`), ``tcp_fraction`` (raw TCP
``sendfile`` of the same bytes over the same veth pair, :mod:`.transfer_tcp` / the
faster two-namespace case) and ``memcpy_fraction``; ``huge_pages`` says whether the
direct cases' memory was the daemon's huge-page tmpfs (:mod:`ensio.transfer.hugemem`),
and ``memory`` the daemon's own line on it.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .transfer_cases import CASES, Case, DirectHost, Placement, direct_host, run_case, unavailable
from .transfer_programs import field_shape
from .transfer_tcp import sync_stream_seconds

__all__ = ["TransferBenchSettings", "bench_transfer", "fresh_memory_write_seconds",
           "launch_seconds", "memcpy_seconds", "summary"]

BASELINES = ("pagecache", "fsync")


@dataclass(frozen=True)
class TransferBenchSettings:
    """Sizes of the benchmark. ``size_mb`` is MiB of float32 data per file, in ``fields``
    2-D variables of 1024 columns (rounded to whole rows); ``poll_ms`` is the poll
    interval of the ``*-poll`` cases; ``warm``: each program (and the fresh-memory
    reference) touches and frees as much memory as it will allocate before its start
    (see :func:`.transfer_programs._warm`); ``compute_ms``: the producer computes
    this long after writing each variable, as a model computes between its outputs
    (the overlap the seed's asynchronous mode exists for; 0 writes back to back);
    ``pool_mb``: the staging daemons' pool of pre-faulted memfds (None: their
    default; 0: none), see :mod:`ensio.transfer.pool`; ``launches``: how many
    ``ensio run --transfer … -- true`` give ``launch_ms`` (0: not measured);
    ``warmup``: rounds of every case run first and not counted (checked all the same):
    the first round met empty daemons (no kept connection, no recycled memory) and was
    the slowest of most cases, while a cycling workflow meets warm ones."""

    files: int = 8
    size_mb: float = 64.0
    fields: int = 4
    repeat: int = 3
    cases: tuple[str, ...] = tuple(CASES)
    poll_ms: float = 1.0
    warm: bool = True
    compute_ms: float = 0.0
    pool_mb: float | None = None
    seed: int = 20041
    launches: int = 11
    warmup: int = 1
    timeout_s: float = 600.0

    @property
    def bytes_per_file(self) -> int:
        """Data bytes of one file (the netCDF header and metadata not counted)."""
        rows, cols = field_shape(self.size_mb, self.fields)
        return 4 * rows * cols * self.fields


def memcpy_seconds(nbytes: int, copies: int, repeat: int = 3) -> float:
    """Seconds to copy ``copies`` times ``nbytes`` between two touched buffers (best of
    ``repeat``): the memory bandwidth the transfer is measured against."""
    src = np.frombuffer(np.random.default_rng(0).bytes(nbytes), dtype=np.uint8)
    dst = np.empty_like(src)
    dst[...] = 1
    best = math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(copies):
            np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return best


def fresh_memory_write_seconds(nbytes: int, copies: int, warm: bool = True,
                               prefaulted: bool = False) -> float:
    """Seconds to write ``copies`` times ``nbytes`` into fresh memfds (one each, closed).

    Not a headline number: the floor of anything that puts a file into memory not
    touched before (the kernel allocates every page), which a direct transfer's
    producer pays and a memcpy between touched buffers does not. ``prefaulted``: the
    memfds' pages are allocated before the clock starts, as the staging daemon's pool
    does (:mod:`ensio.transfer.pool`): the floor of a producer writing into the pool.
    """
    from ..transfer.pool import fallocate_keep_size

    src = np.frombuffer(np.random.default_rng(1).bytes(nbytes), dtype=np.uint8)
    if warm:
        np.ones(nbytes * copies, dtype=np.uint8)  # as the programs do before their start
    total = 0.0
    for _ in range(copies):
        fd = os.memfd_create("ensio-bench", os.MFD_CLOEXEC)
        try:
            if prefaulted:
                fallocate_keep_size(fd, nbytes)
            t = time.perf_counter()
            view = memoryview(src)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)  # freeing the pages is timed too, as the programs' exit is
        total += time.perf_counter() - t
    return total


def bench_transfer(st: TransferBenchSettings, workdir: str | Path | None = None,
                   on_step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every case ``st.repeat`` times, interleaved; the best time of each and the ratios.

    Raises
    ------
    ValueError
        A case name is unknown.
    RuntimeError
        A program failed, or a consumer read something else than was written.
    """
    from .machine import describe_machine

    unknown = [c for c in st.cases if c not in CASES]
    if unknown:
        raise ValueError(f"--cases: unknown case {unknown[0]!r} (known: {', '.join(CASES)})")
    root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(
        prefix="ensio-bench-transfer-"))
    root.mkdir(parents=True, exist_ok=True)
    cases = [CASES[c] for c in st.cases]
    load_start = list(os.getloadavg())
    with contextlib.ExitStack() as stack:
        host, places, skipped = _placements(cases, stack, st.pool_mb)
        runs: dict[str, list[dict[str, Any]]] = {}
        copies: list[float] = []
        fresh: list[float] = []
        prefaulted: list[float] = []
        tcp: list[float] = []
        for rep in range(-st.warmup, st.repeat):
            for case in cases[rep % len(cases):] + cases[:rep % len(cases)]:
                if case.name in skipped:
                    continue
                if on_step is not None:
                    on_step(f"{case.name} (warm-up)" if rep < 0 else
                            f"{case.name} (repeat {rep + 1}/{st.repeat})")
                r = run_case(case, asdict(st), root / f"{case.name}-{rep}",
                             places.get(case.hosts) if case.exchange == "direct" else None)
                _check(case, r)
                if rep < 0:  # not counted (see TransferBenchSettings)
                    shutil.rmtree(Path(r["run_dir"]) / "data", ignore_errors=True)
                    continue
                if case.name == "direct-2ns":  # sync: the closes are the stream alone
                    r = {**r, "stream_seconds": sync_stream_seconds(r["run_dir"])}
                runs.setdefault(case.name, []).append(r)
                shutil.rmtree(Path(r["run_dir"]) / "data", ignore_errors=True)
            if rep < 0:
                continue
            if 2 in places:
                if on_step is not None:
                    on_step(f"raw TCP (repeat {rep + 1}/{st.repeat})")
                tcp.append(_raw_tcp(places[2], st))
            copies.append(memcpy_seconds(st.bytes_per_file, st.files))
            fresh.append(fresh_memory_write_seconds(st.bytes_per_file, st.files, st.warm))
            prefaulted.append(fresh_memory_write_seconds(st.bytes_per_file, st.files, st.warm,
                                                         prefaulted=True))
        features = sorted(host.features) if host is not None else []
        launches: list[float] = []
        if host is not None and not host.error and st.launches > 0:
            if on_step is not None:
                on_step(f"launch ({st.launches} × ensio run --transfer … -- true)")
            launches = launch_seconds(host, root / "launch", st.launches)
        memory = _memory_line(host)
    total = st.files * st.bytes_per_file
    return summary(st, runs, skipped, min(copies), {
        "memory": memory, "launch_command": _ensio_command()[0],
        "fresh_memory_write_seconds": min(fresh),
        "fresh_memory_write_gb_per_s": total / min(fresh) / 1e9,
        "prefaulted_memory_write_gb_per_s": total / min(prefaulted) / 1e9,
        "machine": describe_machine(root), "workdir": str(root), "cores": os.cpu_count(),
        "load_average_start": load_start,
        "load_average": list(os.getloadavg()), "daemon_features": features,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        fresh_s=fresh, tcp_s=tcp, launch_s=launches)


def _ensio_command() -> list[str]:
    """How a user starts ensio: the console script beside this interpreter (what
    ``pip install`` puts on PATH), else on PATH, else ``python -m ensio``."""
    beside = Path(sys.executable).with_name("ensio")
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which("ensio")
    return [found] if found else [sys.executable, "-m", "ensio"]


def launch_seconds(host: DirectHost, directory: Path, count: int) -> list[float]:
    """Wall seconds of ``count`` launches of ``ensio run --transfer CFG --component
    consumer -- true`` on ``host`` (its daemon is running: reused, as a workflow's
    second and later launches find it), each from before the fork to the exit.

    Raises
    ------
    RuntimeError
        A launch failed (its stderr's last line).
    """
    from .childenv import child_env
    from .transfer_cases import Case, _config

    directory.mkdir(parents=True, exist_ok=True)
    config = _config(Case("launch", "direct", "create"), directory / "transfer.yaml",
                     directory, host)
    env = {**child_env(drop_preload=True), **host.env("consumer")}
    argv = [*_ensio_command(), "run", "--transfer", str(config), "--component", "consumer",
            "--", "true"]
    out = []
    for _ in range(count):
        t = time.perf_counter()
        p = subprocess.run(argv, env=env, cwd=directory, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=120)
        out.append(time.perf_counter() - t)
        if p.returncode != 0:
            tail = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
            raise RuntimeError(f"ensio run --transfer … -- true failed: {tail}")
    return out


def _raw_tcp(pair: Placement, st: TransferBenchSettings) -> float:
    """One raw TCP ``sendfile`` of the run's bytes between the namespaces of ``pair``."""
    from .transfer_netns import ADDRESSES
    from .transfer_tcp import raw_tcp_seconds

    prefix = {r: pair.prefix(r) for r in ("producer", "consumer")}
    return raw_tcp_seconds(prefix, ADDRESSES, st.bytes_per_file, st.files, st.timeout_s)


def _memory_line(host: DirectHost | None) -> str | None:
    """The one-host daemon's line on its memory (huge-page tmpfs or memfds, and why)."""
    from ..transfer.protocol import LOG_NAME

    if host is None:
        return None
    try:
        lines = (host.dir / LOG_NAME).read_text().splitlines()
    except OSError:
        return None
    found = [ln.split("memory: ", 1)[1] for ln in lines if "memory: " in ln]
    return found[-1] if found else None


def _placements(cases: Sequence[Case], stack: contextlib.ExitStack, pool_mb: float | None
                ) -> tuple[DirectHost | None, dict[int, Placement], dict[str, str]]:
    """The one-host daemon and, if a two-host case can run, the namespace pair; the cases
    that cannot be measured, with the reason. Everything started is closed by ``stack``."""
    from .transfer_netns import netns_pair

    host = None
    if any(c.exchange == "direct" for c in cases):
        host = stack.enter_context(direct_host(pool_mb))
    skipped = {c.name: why for c in cases if (why := unavailable(c, host)) is not None}
    places: dict[int, Placement] = {} if host is None else {1: host}
    if any(c.hosts == 2 and c.name not in skipped for c in cases):
        try:
            places[2] = stack.enter_context(netns_pair())
        except RuntimeError as exc:
            skipped.update({c.name: f"two network namespaces: {exc}" for c in cases
                            if c.hosts == 2})
    return host, places, skipped


def _check(case: Case, r: Mapping[str, Any]) -> None:
    """Refuse a run whose consumer read other data, or by another way, than the case says."""
    if not r["verified"]:
        raise RuntimeError(f"{case.name}: the consumer read other data than the producer "
                           f"wrote (see {r['run_dir']})")
    want = ["memory"] if case.exchange == "direct" else ["file"]
    if r["sources"] != want or (case.exchange == "direct" and r["on_disk"]):
        raise RuntimeError(f"{case.name}: the consumer read from {r['sources']} (files on "
                           f"disk: {r['on_disk']}), expected {want[0]} (see {r['run_dir']})")


def summary(st: TransferBenchSettings, runs: Mapping[str, Sequence[Mapping[str, Any]]],
            skipped: Mapping[str, str], t_memcpy: float, extra: Mapping[str, Any], *,
            fresh_s: Sequence[float] = (), tcp_s: Sequence[float] = (),
            launch_s: Sequence[float] = ()) -> dict[str, Any]:
    """Rows per case (best run and median) and the headline ratios (of medians).

    ``speedup_fsync`` and ``speedup_pagecache`` divide the faster (by median) of the
    two ways of telling the consumer (pipe or polling) by the direct sync case, so the
    file exchange is given its best showing. ``memcpy_fraction`` is the direct case's
    bandwidth over memcpy's (N·S bytes each; memcpy's best). ``limit_ratio``: direct
    over ``fresh_s`` (the bytes written into fresh memory, each round). ``tcp_fraction``:
    ``tcp_s`` (raw TCP of the bytes) over the faster two-namespace case (throughput
    ratio); ``stream_fraction``: the same over the sync two-namespace producer's summed
    close times (``stream_seconds``: the daemons' stream alone, without the programs'
    own CPU). ``launch_ms``: the median of ``launch_s``. Rows also carry the median CPU
    seconds the producer and the consumer used in the timed window (less sensitive to
    other load on the machine than the wall times). ``huge_pages``: every one-host
    direct run read the daemon's huge-page tmpfs (None: none measured).
    ``async_after_close_ratio`` is the time from the producer's last close call (the
    netCDF close: the file handed over; a sync close may itself wait for the transfer)
    to the consumer's last byte, the shortest of the repeats, async over sync: across
    the two namespaces when both were measured (where async has something to hide),
    else on one host. A ratio whose cases were not measured is None.
    """
    total = st.files * st.bytes_per_file
    best = {k: min(v, key=lambda r: r["seconds"]) for k, v in runs.items()}
    median = {k: float(np.median([r["seconds"] for r in v])) for k, v in runs.items() if v}

    def seconds(*names: str) -> float | None:
        got = [median[n] for n in names if n in median]
        return min(got) if got else None

    direct = seconds("direct")
    rows = []
    for name in st.cases:
        case = CASES[name]
        row: dict[str, Any] = {"case": name, "label": case.label, "exchange": case.exchange,
                               "notify": case.notify, "fsync": case.fsync, "mode": case.mode,
                               "hosts": case.hosts, "measured": name in best,
                               "reason": skipped.get(name)}
        if name in best:
            r = best[name]
            row.update({k: r[k] for k in ("seconds", "producer_seconds", "after_close_seconds",
                                          "last_close_seconds", "run_dir")})
            row["min_after_close_seconds"] = min(x["after_close_seconds"] for x in runs[name])
            row["all_seconds"] = [x["seconds"] for x in runs[name]]
            row["median_seconds"] = float(np.median(row["all_seconds"]))
            for who in ("producer", "consumer"):  # CPU in the timed window, median
                cpu = [x[f"{who}_cpu_seconds"] for x in runs[name]
                       if x.get(f"{who}_cpu_seconds") is not None]
                row[f"{who}_cpu_seconds"] = float(np.median(cpu)) if cpu else None
            row["gb_per_s"] = total / r["seconds"] / 1e9
            row["memcpy_fraction"] = t_memcpy / r["seconds"]
            row["direct_speedup"] = None if direct is None else r["seconds"] / direct
            row["verified"] = all(x["verified"] for x in runs[name])
            row["read_from"] = r["sources"][0] if len(r["sources"]) == 1 else r["sources"]
        rows.append(row)
    fsync, pagecache = seconds("fsync", "fsync-poll"), seconds("pagecache", "pagecache-poll")
    after = {n: min(x["after_close_seconds"] for x in v) for n, v in runs.items()}
    by_hosts = {"1": _ratio(after.get("direct-async"), after.get("direct")),
                "2": _ratio(after.get("direct-2ns-async"), after.get("direct-2ns"))}
    one_host = [b for n in ("direct", "direct-async") for r in runs.get(n, ())
                for b in r.get("backings", ())]
    return {
        "statistic": "median",
        "speedup_fsync": _ratio(fsync, direct),
        "speedup_pagecache": _ratio(pagecache, direct),
        "huge_pages": (all(b == "tmpfs-huge" for b in one_host) if one_host else None),
        "memory_backings": sorted(set(one_host)),
        "limit_ratio": _ratio(direct, _median(fresh_s)),
        "launch_ms": None if not launch_s else 1000.0 * float(np.median(launch_s)),
        "launch_ms_all": [1000.0 * x for x in launch_s],
        "tcp_fraction": _ratio(_median(tcp_s), seconds("direct-2ns", "direct-2ns-async")),
        "stream_fraction": _ratio(_median(tcp_s), _median(
            [r["stream_seconds"] for r in runs.get("direct-2ns", ()) if "stream_seconds" in r])),
        "raw_tcp_seconds": list(tcp_s),
        "raw_tcp_gb_per_s": None if not tcp_s else total / _median(tcp_s) / 1e9,
        "memcpy_fraction": _ratio(t_memcpy, direct),
        "async_after_close_ratio": by_hosts["2"] if by_hosts["2"] is not None else by_hosts["1"],
        "async_after_close_ratio_by_hosts": by_hosts,
        "verified": bool(best) and all(r.get("verified", True) for r in rows),
        "settings": {**asdict(st), "bytes_per_file": st.bytes_per_file, "bytes_total": total,
                     "shape": list(field_shape(st.size_mb, st.fields))},
        "reading": "netCDF4 (every variable read whole, decoded arrays)",
        "memcpy_seconds": t_memcpy, "memcpy_gb_per_s": total / t_memcpy / 1e9,
        "rows": rows, **extra,
    }


def _median(xs: Sequence[float]) -> float | None:
    return float(np.median(xs)) if len(xs) else None


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den <= 0 else num / den
