"""The two programs of ``ensio bench transfer``: a netCDF-4 producer and a netCDF-4 consumer.

Each runs as its own process (``python -m ensio.bench.transfer_programs ROLE SPEC``),
under ``ensio run --transfer`` for the direct cases and plainly for the file
exchanges, so both sides are what an unmodified model and post-processor are: the
netCDF library doing ``open``/``write``/``read`` on a path. ``SPEC`` is a JSON file
the driver (:mod:`ensio.bench.transfer`) writes; nothing here parses options.

Synchronisation, without sleeps:

* start: the consumer imports its libraries (and warms its memory, :func:`_warm`) and
  writes one byte to the ``go`` pipe; the producer, data generated and checksummed
  (memory warmed), blocks on that pipe and takes its start time only then (so neither
  program's start-up is timed);
* each file: ``notify: create`` (direct cases) writes the file's index to the
  ``notify`` pipe as soon as the netCDF create returned, and the consumer's netCDF
  open then blocks in the staging daemon until the producer's close; ``notify:
  close`` writes it after the close (and the fsync of the file and its directory
  when ``fsync``): a plain file cannot be read before it is complete; ``notify:
  poll`` writes nothing: the producer writes ``NAME.part`` and renames it, and the
  consumer polls for the final name every ``poll_s`` until ``deadline_s``.

Times are ``time.monotonic()`` (``CLOCK_MONOTONIC``: one clock for every process of
the host, network namespaces included). Each program also reports the CPU time it used
in that window (``cpu``, ``time.process_time``: user and system, all its threads): on a
shared machine the wall time swings with other load, the CPU time much less. The
consumer reads every variable whole through netCDF4 and keeps the arrays until its end
time is taken; only then does it checksum them (SHA-256 of each variable's bytes,
compared by the driver with the producer's checksums of the arrays it wrote) and unlink
the files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["consumer", "field_shape", "main", "producer"]

#: Columns of every field (float32): a row is 4 KiB.
NX = 1024


def field_shape(size_mb: float, fields: int) -> tuple[int, int]:
    """(rows, NX) of each float32 field so that ``fields`` of them hold about ``size_mb`` MiB."""
    rows = max(1, round(size_mb * 2**20 / (4 * NX * fields)))
    return rows, NX


def _digest(a: Any) -> str:
    return hashlib.sha256(memoryview(a).cast("B")).hexdigest()


def producer(spec: dict[str, Any]) -> dict[str, Any]:
    """Write ``spec["paths"]`` as netCDF-4 files; times and the checksums of what was written."""
    import netCDF4
    import numpy as np

    shape = field_shape(spec["size_mb"], spec["fields"])
    data = []
    for i in range(len(spec["paths"])):
        rng = np.random.default_rng([spec["seed"], i])
        data.append([rng.random(shape, dtype=np.float32) for _ in range(spec["fields"])])
    sums = [[_digest(a) for a in arrays] for arrays in data]
    notify, poll = spec["notify"], spec["notify"] == "poll"
    _warm(sum(a.nbytes for arrays in data for a in arrays) if spec.get("warm") else 0)
    with os.fdopen(spec["go_fd"], "rb") as go, os.fdopen(spec["notify_fd"], "w") as out:
        if go.read(1) != b"g":
            raise RuntimeError("the consumer exited before it was ready")
        t0 = time.monotonic()
        cpu0 = time.process_time()
        closes, close_calls, opens = [], [], []
        for i, (path, arrays) in enumerate(zip(spec["paths"], data, strict=True)):
            target = path + ".part" if poll else path
            ds = netCDF4.Dataset(target, "w", format="NETCDF4")
            opens.append(time.monotonic())  # created (across hosts: the streams opened)
            if notify == "create":
                out.write(f"{i}\n")
                out.flush()
            ds.createDimension("y", shape[0])
            ds.createDimension("x", shape[1])
            for k, a in enumerate(arrays):
                ds.createVariable(f"f{k}", "f4", ("y", "x"))[...] = a
                _compute(spec.get("compute_s", 0.0), a)
            close_calls.append(time.monotonic())  # the producer hands the file over
            ds.close()
            if spec["fsync"]:
                _fsync(target)
            closes.append(time.monotonic())  # complete (and durable): before anyone is told
            if poll:
                os.rename(target, path)
                if spec["fsync"]:
                    _fsync(os.path.dirname(path))
            if notify == "close":
                out.write(f"{i}\n")
                out.flush()
        cpu = time.process_time() - cpu0
    return {"t0": t0, "cpu": cpu, "opens": opens, "close_calls": close_calls, "closes": closes,
            "sha256": sums,
            "shape": list(shape)}


def _compute(seconds: float, a: Any) -> None:
    """Busy arithmetic for ``seconds`` (a model's time step), on one core like a model."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        float(a[:64].sum())


def _warm(nbytes: int) -> None:
    """Touch and free ``nbytes`` of memory before the start.

    On a virtual machine whose memory the host backs lazily (and takes back when the
    guest frees it), the first touch of a page can cost ten times a copy; which pages
    a run gets would then decide its time, not how the file is exchanged. Touching as
    much as the run will allocate just before the start leaves the kernel with backed
    free pages; on bare metal this changes nothing.
    """
    if nbytes > 0:
        import numpy as np

        np.ones(nbytes, dtype=np.uint8)


def _fsync(path: str) -> None:
    """Make ``path`` durable: its data (any descriptor's dirty pages), and for a file also
    its directory entry."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if not os.path.isdir(path):
        _fsync(os.path.dirname(path) or ".")


def consumer(spec: dict[str, Any]) -> dict[str, Any]:
    """Read every variable of every file through netCDF4, in the producer's order."""
    import netCDF4
    import numpy as np  # noqa: F401  (imported before the start, not inside the timing)

    paths, poll = spec["paths"], spec["notify"] == "poll"
    got: list[list[Any]] = []
    opened = []
    rows, cols = field_shape(spec["size_mb"], spec["fields"])
    _warm(4 * rows * cols * spec["fields"] * len(paths) if spec.get("warm") else 0)
    with os.fdopen(spec["go_fd"], "wb") as go, os.fdopen(spec["notify_fd"], "r") as notes:
        go.write(b"g")
        go.flush()
        cpu0 = time.process_time()  # from here the consumer waits for the producer
        for i, path in enumerate(paths):
            if poll:
                _poll(path, spec["poll_s"], spec["deadline_s"])
            else:
                line = notes.readline()
                if line != f"{i}\n":
                    raise RuntimeError(f"expected file {i} from the producer, got {line!r}")
            opened.append(time.monotonic())
            with netCDF4.Dataset(path, "r") as ds:
                ds.set_auto_mask(False)
                got.append([ds.variables[f"f{k}"][...] for k in range(spec["fields"])])
        t_end = time.monotonic()
        cpu = time.process_time() - cpu0
    sums = [[_digest(a) for a in arrays] for arrays in got]
    nbytes = sum(a.nbytes for arrays in got for a in arrays)
    backings = [_backing(path) for path in paths]
    sources = ["file" if b == "file" else "memory" for b in backings]
    names = {os.path.basename(p) for p in paths}
    on_disk = sorted(names & _real_listing(os.path.dirname(paths[0])))
    for path in paths:
        os.unlink(path)
    return {"t_end": t_end, "cpu": cpu, "opened": opened, "sha256": sums, "bytes": nbytes,
            "sources": sources, "backings": backings, "on_disk": on_disk}


def _source(path: str) -> str:
    """``memory`` if opening ``path`` gives the staging daemon's memory, else ``file``.

    The daemon's memory is a memfd (``/memfd:NAME``) or a file of its private huge-page
    tmpfs (:mod:`ensio.transfer.hugemem`: no name, on a mount of no namespace, so
    ``/#INODE (deleted)``). The directory listing beside it (taken with the interposer's
    view off, :func:`_real_listing`) shows what is really on disk:
    together they prove a direct case never touched the file system.
    """
    return "file" if _backing(path) == "file" else "memory"


def _backing(path: str) -> str:
    """What opening ``path`` gives: ``memfd``, ``tmpfs-huge`` (the daemon's huge-page
    tmpfs) or ``file``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        link = os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    if link.startswith("/memfd:"):
        return "memfd"
    if re.fullmatch(r"/#\d+ \(deleted\)", link):
        return "tmpfs-huge"
    return "file"


def _real_listing(directory: str) -> set[str]:
    """The names really on disk in ``directory``: listed by a child without the
    interposer (whose directory view also lists the held names)."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, "-c", "import os, sys; print('\\n'.join("
                          "os.listdir(sys.argv[1])))", directory], env=env, check=True,
                         capture_output=True, text=True).stdout
    return set(out.split())


def _poll(path: str, every: float, deadline: float) -> None:
    """Wait until ``path`` exists, looking every ``every`` seconds, at most ``deadline``."""
    end = time.monotonic() + deadline
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(f"{path}: did not appear within {deadline} s")
        time.sleep(every)  # the poll interval is the thing measured, not a synchronisation


def main(role: str, spec_path: str) -> int:
    """Run ``role`` with the spec file; its result goes to ``spec["result"]`` (JSON)."""
    spec = json.loads(Path(spec_path).read_text())
    out = {"producer": producer, "consumer": consumer}[role](spec)
    Path(spec["result"]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
