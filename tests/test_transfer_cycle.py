"""``ensio cycle`` with ``workflow.transfer``: restarts go from the models to ``ensio analyse``
and back through memory; the analyses equal the file-based run's, and only what the
documentation promises (products; the last cycle's analysis members; ``persist``) reaches
the disk.

Whether a transferred file ever touched the disk is watched with inotify (every file
created or renamed into the run's ``forecast/`` and ``analysis/`` directories during the
run), not by looking at the end: a file written and renamed away would leave no trace.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import matrix
import netCDF4
import numpy as np
import pytest
import yaml
from kill_support import MAX_MISSES
from test_cycle import _offline_mid_cycle, _signal_run
from transfer_support import (  # noqa: F401  (the *_fixture names are fixtures)
    Host,
    daemon_pid,
    host_fixture,
    interposer_cache_fixture,
    process_gone,
    wait_for,
)

SYNTHETIC = Path(__file__).parents[1] / "examples" / "synthetic" / "cycle.yaml"
EXAMPLE_TRANSFER = SYNTHETIC.with_name("transfer.yaml")
NE = 3
FAST = [
    "--set", f"ensemble.size={NE}", "--set", "workflow.jobs=2",
    "--set", "workflow.analysis_ranks=1", "--set", "workflow.retries=0",
    "--set", "workflow.setup=ensio synth {workdir}/init --nx 36 --ny 18 --members {members} "
             "--seed 1",
    "--set", "workflow.member_command=python {script} {cycle} {analysis} {forecast}",
]  # fmt: skip

# The member task: ``ensio model synthrun`` (a temporary file renamed into place), or a
# failure in cycle 2 while the file STOP exists (to end a run between two cycles).
MEMBER = """
import sys
import tempfile
from pathlib import Path
from ensio.models import synthrun
cycle, init, out = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
if cycle == 2 and Path(sys.argv[0]).with_name("STOP").exists():
    sys.exit("stopped before cycle 2")
synthrun.run(init, out, shift=3)
"""

IN_MOVED_TO, IN_CREATE, IN_NONBLOCK = 0x80, 0x100, 0o4000
MEMBER_NAME = re.compile(r"mem\d{3}\.nc")


class Watch:
    """Names created in (or renamed into) some directories, in order (inotify)."""

    def __init__(self, dirs: list[Path]) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(IN_NONBLOCK)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        self.dirs = {}
        for d in dirs:
            d.mkdir(parents=True, exist_ok=True)
            wd = self.libc.inotify_add_watch(self.fd, os.fsencode(d), IN_CREATE | IN_MOVED_TO)
            assert wd >= 0, os.strerror(ctypes.get_errno())
            self.dirs[wd] = d
        self.seen: dict[Path, list[str]] = {d: [] for d in dirs}

    def collect(self) -> dict[Path, list[str]]:
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return self.seen
            pos = 0
            while pos < len(data):
                wd, _mask, _cookie, n = struct.unpack_from("iIII", data, pos)
                name = data[pos + 16:pos + 16 + n].rstrip(b"\0").decode()
                self.seen[self.dirs[wd]].append(name)
                pos += 16 + n

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def setup(host: Host):
    """The member script and a transfer config (``persist`` per test) in the test's directory."""
    w = host.work
    (w / "member.py").write_text(MEMBER)

    def transfer_yaml(persist: bool = False) -> Path:
        conns = [{"name": "forecasts", "from": "members", "to": "analysis",
                  "files": ["cycle_*/forecast/*mem*.nc*"]},
                 {"name": "analyses", "from": "analysis", "to": "members",
                  "files": ["cycle_*/analysis/*mem*.nc*"], "persist": persist}]
        path = w / f"t-{int(persist)}.yaml"
        path.write_text(yaml.safe_dump({"components": ["members", "analysis"],
                                        "connections": conns}))
        return path

    return host, transfer_yaml


#: the kill tests' lease: the killed jobs' tasks are taken over after 10 s, not a minute
SHORT_LEASE = ("--set", "workflow.lease=10")


def _start(host: Host, workdir: Path, transfer: Path | None, cycles: int = 2,
           more: tuple[str, ...] = ()) -> subprocess.Popen:
    extra = ["--set", f"workflow.transfer={transfer}"] if transfer is not None else []
    extra += more
    fast = [a.replace("{script}", str(host.work / "member.py")) for a in FAST]
    return subprocess.Popen(
        [sys.executable, "-m", "ensio.cli.main", "cycle", str(SYNTHETIC), "--workdir",
         str(workdir), "--cycles", str(cycles), *fast, *extra],
        env=host.env, cwd=host.work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)


def _run(host: Host, workdir: Path, transfer: Path | None, cycles: int = 2,
         more: tuple[str, ...] = ()):
    proc = _start(host, workdir, transfer, cycles, more)
    out, err = proc.communicate(timeout=600)
    return proc, out, err


def _same_data(a_path: Path, b_path: Path) -> None:
    """Every variable (values, dtype, attributes) and global attribute but ``history``."""
    with netCDF4.Dataset(a_path) as a, netCDF4.Dataset(b_path) as b:
        assert set(a.variables) == set(b.variables), a_path
        for v in a.variables:
            x, y = a[v], b[v]
            x.set_auto_maskandscale(False)
            y.set_auto_maskandscale(False)
            assert x.dtype == y.dtype and x.dimensions == y.dimensions, (a_path, v)
            assert np.array_equal(np.asarray(x[...]), np.asarray(y[...]), equal_nan=True), \
                (a_path, v)
            assert {k: str(x.getncattr(k)) for k in x.ncattrs()} == \
                {k: str(y.getncattr(k)) for k in y.ncattrs()}, (a_path, v)
        strip = lambda ds: {k: str(ds.getncattr(k)) for k in ds.ncattrs() if k != "history"}  # noqa: E731
        assert strip(a) == strip(b), a_path


@pytest.fixture(scope="module")
def reference(interposer_cache: Path, tmp_path_factory: pytest.TempPathFactory):
    """The file-based 2-cycle run every test compares with: run once per module.

    It is deterministic (fixed seed) and only read by the tests, so one run
    serves them all (it was re-run for each of 4 tests). Its own work and daemon
    directories: a run without ``workflow.transfer`` starts no daemon, which is
    checked.
    """
    base = tmp_path_factory.mktemp("reference")
    work = base / "work"
    work.mkdir()
    (work / "member.py").write_text(MEMBER)
    sock_dir = Path(tempfile.mkdtemp(prefix="ensio-t-", dir="/tmp"))
    try:
        proc, _, err = _run(Host(sock_dir, interposer_cache, work), base / "files", None)
        assert not (sock_dir / "daemon.lock").exists(), "the file-based run started a daemon"
    finally:
        shutil.rmtree(sock_dir)
    assert proc.returncode == 0, err[-3000:]
    return base / "files"


def _listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def test_cycle_through_memory_equals_the_file_based_cycle(setup, reference, tmp_path):
    """With the example's transfer config (a path relative to the cycle config)."""
    host, _ = setup
    workdir = tmp_path / "transfer"
    dirs = {(c, k): workdir / f"cycle_{c:03d}" / k for c in (1, 2)
            for k in ("forecast", "analysis")}
    watch = Watch(list(dirs.values()))
    try:
        proc = _start(host, workdir, Path(EXAMPLE_TRANSFER.name))
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        seen = watch.collect()
    finally:
        watch.close()
    assert "cycle 2: done (3 of 3 members + analysis)" in out
    members = [f"mem{m:03d}.nc" for m in range(1, NE + 1)]
    # what the file-based run has on disk: forecasts, every analysis member, products
    def members_in(names: list[str]) -> list[str]:
        return [n for n in names if MEMBER_NAME.search(n)]

    for c in (1, 2):
        assert members_in(_listing(reference / f"cycle_{c:03d}" / "forecast")) == members
    # under transfer: no forecast, nor a temporary of one, ever touched the disk (the
    # analysis's run record, .ensio-runs.jsonl, is a file beside them)
    for c in (1, 2):
        assert members_in(seen[dirs[c, "forecast"]]) == [], seen[dirs[c, "forecast"]]
        assert members_in(_listing(dirs[c, "forecast"])) == []
    # cycle 1's analysis members stayed in memory (not persisted); its products are files
    assert members_in(seen[dirs[1, "analysis"]]) == []
    assert _listing(dirs[1, "analysis"]) == ["mean.nc", "spread.nc"]
    # the last cycle's analysis members were written once, by the driver at the end
    # (its temporary names carry its pid), never by the analysis (.ensio-partial)
    written = members_in(seen[dirs[2, "analysis"]])
    tmp = re.compile(rf"\.(mem\d{{3}}\.nc)\.ensio-tmp\.{proc.pid}\.[0-9a-f]+")
    assert sorted(n for n in written if not tmp.fullmatch(n)) == members, written
    assert sorted(tmp.fullmatch(n).group(1) for n in written if tmp.fullmatch(n)) == members
    assert _listing(dirs[2, "analysis"]) == sorted(members + ["mean.nc", "spread.nc"])
    # the same analysis: member files byte for byte, products' data (their history differs)
    for m in members:
        assert (dirs[2, "analysis"] / m).read_bytes() == \
            (reference / "cycle_002" / "analysis" / m).read_bytes(), m
        _same_data(dirs[2, "analysis"] / m, reference / "cycle_002" / "analysis" / m)
    for c in (1, 2):
        for p in ("mean.nc", "spread.nc"):
            _same_data(dirs[c, "analysis"] / p, reference / f"cycle_{c:03d}" / "analysis" / p)
    # the daemon was started by the run and let go of every file it held
    assert host.status() == []
    assert (workdir / "transfer.yaml").read_text() == EXAMPLE_TRANSFER.read_text()


def _stop_between_cycles(host: Host, workdir: Path, transfer: Path) -> None:
    """Run cycle 1, fail in cycle 2 (the analysis members of cycle 1 stay held)."""
    (host.work / "STOP").write_text("")
    proc, _, err = _run(host, workdir, transfer)
    assert proc.returncode == 2, err[-3000:]
    assert "cycle 2: analysis refused" in err and "exit status 1" in err
    (host.work / "STOP").unlink()
    held = {s.path for s in host.status() if s.state == "complete"}
    assert held == {str((workdir / "cycle_001" / "analysis" / f"mem{m:03d}.nc").resolve())
                    for m in range(1, NE + 1)}


def _kill_daemon(host: Host) -> None:
    pid = daemon_pid(host.dir)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: process_gone(pid), what="the daemon's exit")


def test_restarts_lost_with_the_daemon_are_an_error_not_stale_data(setup, tmp_path):
    host, transfer_yaml = setup
    workdir = tmp_path / "run"
    _stop_between_cycles(host, workdir, transfer_yaml())
    _kill_daemon(host)
    proc, _, err = _run(host, workdir, transfer_yaml())
    assert proc.returncode == 2
    last = err.strip().splitlines()[-1]
    assert "mem001.nc (and 2 more)" in last and "lost" in last and "persist: true" in last, err
    assert "cycle_001" in last
    assert not (workdir / "cycle_002" / ".done").exists()


def test_persisted_restarts_survive_the_daemon(setup, reference, tmp_path):
    host, transfer_yaml = setup
    workdir = tmp_path / "run"
    config = transfer_yaml(persist=True)
    _stop_between_cycles(host, workdir, config)
    analysis = workdir / "cycle_001" / "analysis"
    wait_for(lambda: all(s.persist == "done" for s in host.status()), what="write-behind")
    _kill_daemon(host)
    assert _listing(analysis) == sorted([f"mem{m:03d}.nc" for m in range(1, NE + 1)]
                                        + ["mean.nc", "spread.nc"])
    # cycle 2 failed for good: a user removes it and runs again (a new daemon starts)
    shutil.rmtree(workdir / "cycle_002")
    proc, out, err = _run(host, workdir, config)
    assert proc.returncode == 0, err[-3000:]
    assert "cycle 2: done (3 of 3 members + analysis)" in out
    for m in range(1, NE + 1):
        name = f"mem{m:03d}.nc"
        assert (workdir / "cycle_002" / "analysis" / name).read_bytes() == \
            (reference / "cycle_002" / "analysis" / name).read_bytes()
        assert (analysis / name).read_bytes() == \
            (reference / "cycle_001" / "analysis" / name).read_bytes()


def _stop_then_kill(workdir: Path, proc: subprocess.Popen, first: int, k: int,
                    seed: int) -> int | None:
    """The cycle in which the run was killed mid-cycle (proven under SIGSTOP), or None."""
    mid_cycle = _offline_mid_cycle(workdir)
    for c in (1, 2)[first - 1:]:
        done = workdir / f"cycle_{c:03d}" / ".done"
        while proc.poll() is None and not done.exists():
            wait_for(lambda c=c, done=done: mid_cycle(c, k) or done.exists()
                     or proc.poll() is not None, timeout=300,
                     what=f"seed {seed}: cycle {c} with {k} members done")
            if not mid_cycle(c, k):
                continue  # the cycle (or the run) ended: the loop's test says which
            _signal_run(workdir, proc, signal.SIGSTOP)
            if mid_cycle(c, k):  # nothing moves: the kill lands mid-cycle
                _signal_run(workdir, proc, signal.SIGKILL)
                return c
            _signal_run(workdir, proc, signal.SIGCONT)  # a task ended meanwhile: go on
    return None


def _kill_mid_cycle(host: Host, tmp_path: Path, config: Path, seed: int) -> Path:
    """SIGKILL the run mid-cycle, proven; returns its work directory.

    The moment comes from the state on disk, drawn from ``seed``: a cycle ``c``
    and a number ``k`` of finished members (``_offline_mid_cycle``). When the run
    is there, every process of it is stopped (SIGSTOP) and the state read again:
    a yes kills everything; a no (a task ended in between) lets the run go on
    and the same cycle, then the next one, is waited for again. That the kill
    landed mid-cycle is then asserted: the driver died of it, and the cycle has
    no ``.done``. A run that ends without such a kill must have succeeded; it is
    drawn again in a fresh directory, failing after MAX_MISSES runs.
    """
    rng = random.Random(seed)
    killed = None
    for attempt in range(1, MAX_MISSES + 1):
        workdir = tmp_path / f"run{attempt}"
        first, k = rng.choice((1, 2)), rng.randrange(0, NE)
        print(f"kill seed {seed}, draw {attempt}: cycle {first} or later, after {k} "
              "finished members")
        proc = _start(host, workdir, config, more=SHORT_LEASE)
        try:
            killed = _stop_then_kill(workdir, proc, first, k, seed)
        finally:
            if killed is None and proc.poll() is None:
                _signal_run(workdir, proc, signal.SIGKILL)
            _, err = proc.communicate()
        if killed is not None:
            assert proc.returncode == -signal.SIGKILL, f"seed {seed}: {proc.returncode}"
            assert not (workdir / f"cycle_{killed:03d}" / ".done").exists(), f"seed {seed}"
            print(f"seed {seed}: killed mid-cycle {killed} after {attempt} draw(s)")
            return workdir
        assert proc.returncode == 0, f"seed {seed}: " + err[-3000:]  # not killed: it succeeded
        print(f"seed {seed}: the run ended before a kill landed mid-cycle; drawn again")
    pytest.fail(f"seed {seed}: {MAX_MISSES} runs in a row ended before a kill landed mid-cycle")


# the daemon killed with the run: full matrix only (make test-full); the default run covers
# a daemon lost between cycles in test_restarts_lost_with_the_daemon_are_an_error_not_stale_data
@pytest.mark.parametrize("daemon_too", [False, True] if matrix.full() else [False],
                         ids=["daemon-lives", "daemon-killed"][:2 if matrix.full() else 1])
def test_resume_after_sigkill(setup, reference, tmp_path, daemon_too):
    """SIGKILL of the run (and of the daemon) mid-cycle at a random moment, then the same command.

    The kill is proven to land mid-cycle (``_kill_mid_cycle``). With the daemon
    alive the run resumes from its memory and ends bitwise as the file-based run,
    every task done once. With the daemon killed too, the resumed run either ends
    the same (nothing it needed was lost) or stops with the one-line "lost"
    error; it never goes on from other data.
    """
    host, transfer_yaml = setup
    config = transfer_yaml()
    seed = int(os.environ.get("ENSIO_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    workdir = _kill_mid_cycle(host, tmp_path, config, seed)
    if daemon_too:
        _kill_daemon(host)
    again, out, err = _run(host, workdir, config, more=SHORT_LEASE)
    if again.returncode != 0:
        assert daemon_too, f"seed {seed}: " + err[-3000:]
        last = err.strip().splitlines()[-1]
        assert again.returncode == 2 and "lost" in last and "persist: true" in last, err
        return
    assert "cycle 2: done" in out
    for m in range(1, NE + 1):
        name = f"mem{m:03d}.nc"
        assert (workdir / "cycle_002" / "analysis" / name).read_bytes() == \
            (reference / "cycle_002" / "analysis" / name).read_bytes(), f"seed {seed}: {name}"
    recs = [json.loads(x) for x in (workdir / "records.jsonl").read_text().splitlines()]
    done = sorted((r["cycle"], r["task"]) for r in recs
                  if r.get("kind") in ("member", "analysis") and r["status"] == "done")
    tasks = [f"mem{m:03d}" for m in range(1, NE + 1)] + ["analysis"]
    assert done == sorted((cy, t) for cy in (1, 2) for t in tasks), f"seed {seed}: {done}"


def test_missing_transfer_config_is_one_line_naming_the_key(setup, tmp_path):
    host, _ = setup
    proc, _, err = _run(host, tmp_path / "run", tmp_path / "absent.yaml")
    assert proc.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ensio: error: workflow.transfer: "), err
    assert "absent.yaml" in lines[0]
    assert not (tmp_path / "run").exists()  # nothing was created


@pytest.mark.parametrize("text, words", [
    ("components: [model, post]\nconnections: []\n", "must include members and analysis"),
    ("components: [members, analysis]\nconnections:\n"
     "  - {name: x, from: members, to: analysis, files: ['cycle_*/forecast/mem*.nc']}\n",
     "the analysis members"),
    ("components: [members, analysis]\nconnections:\n"
     "  - {name: x, from: members, to: analysis, files: ['cycle_*/forecast/mem*.nc']}\n"
     "  - {name: y, from: analysis, to: members, files: ['cycle_*/analysis/mem*.nc']}\n"
     "  - {name: z, from: members, to: [nobody], files: ['other/*.nc']}\n",
     "connections[2].to"),
])
def test_unusable_transfer_config_is_one_line_naming_the_key(setup, tmp_path, text, words):
    host, _ = setup
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    proc, _, err = _run(host, tmp_path / "run", bad)
    assert proc.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ensio: error: workflow.transfer: "), err
    assert words in lines[0], lines[0]
    assert not (tmp_path / "run").exists()
