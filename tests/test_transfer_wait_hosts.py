"""Issue 28 item 1 across hosts: a consumer on host b started before its producer on a.

Two network namespaces (transfer_hosts.py), the producer component on a, the consumer
component on b. b's daemon learns a's producer runs over the control connection
between the daemons (``RUNS``, transfer/names.py), so a consumer on b waits as on one
host: for a name a's producer will write (it reads the file once a creates it), until
``consumer_timeout_s`` (ETIMEDOUT, logged on b), and not at all once a's producer run
has finished without the name (ENOENT at once). A wait ends with EIO, not the full
timeout, when a's daemon dies. That the consumer waits is proven by b's daemon's log
line, never by a sleep.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import needs
import pytest
from transfer_hosts import NetHost, hosts_config, two_hosts_fixture  # noqa: F401
from transfer_support import (  # noqa: F401  (the *_fixture names are fixtures)
    CDL,
    daemon_pid,
    interposer_cache_fixture,
    process_gone,
    wait_for,
)

from ensio.transfer.entries import Peer
from ensio.transfer.view import Runs

WAITS = "waits for it to be produced"


def _waiting(host: NetHost, path: Path) -> bool:
    return any(str(path) in line and WAITS in line for line in host.log().splitlines())


def _wait_logged(host: NetHost, path: Path, consumer: subprocess.Popen) -> None:
    """Until ``host``'s daemon logs that ``consumer`` waits for ``path``; fails at once if
    the consumer ended instead (today's ENOENT)."""
    wait_for(lambda: _waiting(host, path) or consumer.poll() is not None,
             what=f"the consumer's wait for {path.name} in host {host.name}'s log")
    assert consumer.poll() is None and _waiting(host, path), consumer.communicate()


def _config(work: Path, placement: dict[str, list[str]], timeout_s: float = 60,
            pattern: str = "1-N") -> Path:
    (work / "fc").mkdir(exist_ok=True)
    return hosts_config(work / "t.yaml", placement, pattern, ["fc/*.nc", "fc/*.txt"],
                        consumer_timeout_s=timeout_s)


def _finish(p: subprocess.Popen) -> tuple[str, str]:
    """The started process's output (killed first if a failed assertion left it running)."""
    try:
        return p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()


@pytest.mark.usefixtures("interposer_cache")
@needs.tools_mark("ncgen", "ncdump")
def test_a_consumer_on_b_started_first_reads_what_a_produces(two_hosts):
    """ncdump on b waits (b's log), is still waiting once a's daemon is up, then reads the
    file a's ncgen writes; nothing reaches the disk."""
    a, b = two_hosts
    cfg = _config(a.work, {"a": ["model"], "b": ["post"]})
    (a.work / "m.cdl").write_text(CDL)
    target = a.work / "fc" / "late.nc"
    consumer = b.start(cfg, "post", "ncdump", "fc/late.nc")
    try:
        _wait_logged(b, target, consumer)
        made = a.run(cfg, "model", "ncgen", "-4", "-o", "fc/late.nc", "m.cdl")
        assert made.returncode == 0, made.stderr
    finally:
        out, err = _finish(consumer)
    assert consumer.returncode == 0, err
    subprocess.run(["ncgen", "-4", "-o", "ref.nc", "m.cdl"], cwd=a.work, check=True)
    want = subprocess.run(["ncdump", "ref.nc"], cwd=a.work, capture_output=True, text=True,
                          check=True).stdout
    assert out.replace("netcdf late", "netcdf ref") == want
    assert not target.exists()  # never on disk
    assert f"{target}: produced, consumer post" in b.log()


@pytest.mark.usefixtures("interposer_cache")
def test_a_consumer_on_b_times_out_with_one_line_naming_file_and_connection(two_hosts):
    a, b = two_hosts
    cfg = _config(a.work, {"a": ["model"], "b": ["post"]}, timeout_s=1)
    r = b.run(cfg, "post", "cat", "fc/never.txt")
    assert r.returncode != 0 and "Connection timed out" in r.stderr, r.stderr
    lines = [x for x in b.log().splitlines() if "ETIMEDOUT" in x]
    assert len(lines) == 1, b.log()
    assert str(a.work / "fc" / "never.txt") in lines[0]
    assert "connection restarts" in lines[0] and "never produced" in lines[0]


@pytest.mark.usefixtures("interposer_cache")
def test_after_a_finished_producer_on_a_enoent_at_once_and_the_next_round_waits(two_hosts):
    """Round 1: a's producer ran and ended, so a name it did not write is ENOENT at once on
    b. Round 2's consumer on b, started before a's round-2 producer, waits again."""
    a, b = two_hosts
    cfg = _config(a.work, {"a": ["model"], "b": ["post"]})
    assert b.run(cfg, "post", "true").returncode == 0  # b's daemon listens
    assert a.run(cfg, "model", "sh", "-c", "echo one > fc/a.txt").returncode == 0
    r = b.run(cfg, "post", "sh", "-c", "cat fc/a.txt; cat fc/b.txt; true", timeout=30)
    assert (r.returncode, r.stdout) == (0, "one\n") and "No such file" in r.stderr, r.stderr
    assert WAITS not in b.log()
    target = a.work / "fc" / "c.txt"
    consumer = b.start(cfg, "post", "cat", "fc/c.txt")
    try:
        _wait_logged(b, target, consumer)
        assert a.run(cfg, "model", "sh", "-c", "echo two > fc/c.txt").returncode == 0
    finally:
        out, err = _finish(consumer)
    assert (consumer.returncode, out) == (0, "two\n"), err
    assert not (a.work / "fc" / "c.txt").exists()


@pytest.mark.usefixtures("interposer_cache")
def test_a_consumer_daemon_started_after_the_producer_finished_gets_enoent(two_hosts):
    """a's producer run ended before b's daemon existed: b asks a when its consumer would
    wait, learns that a's round is over, and answers ENOENT at once."""
    a, b = two_hosts
    cfg = _config(a.work, {"a": ["model"], "b": ["post"]})
    assert a.run(cfg, "model", "true").returncode == 0  # a producer run, nothing written
    r = b.run(cfg, "post", "cat", "fc/x.txt", timeout=30)
    assert r.returncode != 0 and "No such file" in r.stderr, r.stderr
    assert WAITS not in b.log()


@pytest.mark.usefixtures("interposer_cache")
def test_a_dead_producer_daemon_ends_the_wait_with_an_error(two_hosts):
    """A consumer on b waits while a's producer runs; a's daemon is killed: the wait ends
    with EIO and one line in b's log naming host a, not after consumer_timeout_s."""
    a, b = two_hosts
    cfg = _config(a.work, {"a": ["model"], "b": ["post"]}, timeout_s=600)
    target = a.work / "fc" / "x.txt"
    consumer = b.start(cfg, "post", "cat", "fc/x.txt")
    producer = a.start(cfg, "model", "sh", "-c", "echo started; read line")
    try:
        _wait_logged(b, target, consumer)
        assert producer.stdout.readline() == "started\n"
        live = re.compile(r"host a: connection restarts: 1 producer run live")
        wait_for(lambda: live.search(b.log()), what="b learning a's live producer run")
        pid = daemon_pid(a.dir)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: process_gone(pid), what="a's daemon's death")
        out, err = _finish(consumer)
    finally:
        producer.kill()
        producer.communicate()
        _finish(consumer)
    assert consumer.returncode != 0 and "Input/output error" in err, err
    lines = [x for x in b.log().splitlines() if "stops waiting" in x and "host a" in x]
    assert len(lines) == 1 and str(target) in lines[0], b.log()


@pytest.mark.usefixtures("interposer_cache")
def test_with_producers_on_both_hosts_a_wait_outlasts_the_local_producers_end(two_hosts):
    """N-1, model on a (rank 0) and b (rank 1), post on b: b's consumer waits for a's
    file; b's own producer run ending meanwhile does not end the wait (the test is made
    when it begins); a's file then arrives and is read."""
    a, b = two_hosts
    cfg = _config(a.work, {"a": ["model"], "b": ["model", "post"]}, pattern="N-1")
    target = a.work / "fc" / "x.txt"
    consumer = b.start(cfg, "post", "cat", "fc/x.txt")
    try:
        _wait_logged(b, target, consumer)
        assert b.run(cfg, "model", "sh", "-c", "echo b > fc/y.txt", rank=1).returncode == 0
        assert a.run(cfg, "model", "sh", "-c", "echo from a > fc/x.txt", rank=0).returncode == 0
    finally:
        out, err = _finish(consumer)
    assert (consumer.returncode, out) == (0, "from a\n"), err
    assert "ETIMEDOUT" not in b.log()
    r = b.run(cfg, "post", "cat", "fc/y.txt")
    assert (r.returncode, r.stdout) == (0, "b\n"), r.stderr


@pytest.mark.usefixtures("interposer_cache")
def test_all_to_all_a_consumer_on_a_host_without_pushes_pulls_once_produced(two_hosts):
    """all-to-all with post placed on no host: b's consumer pulls from a. Started first, it
    waits, and gets the file once a's producer has written it."""
    a, b = two_hosts
    cfg = _config(a.work, {"a": ["model"], "b": ["model"]}, pattern="all-to-all")
    target = a.work / "fc" / "x.txt"
    consumer = b.start(cfg, "post", "cat", "fc/x.txt")
    try:
        _wait_logged(b, target, consumer)
        assert a.run(cfg, "model", "sh", "-c", "echo pulled > fc/x.txt").returncode == 0
    finally:
        out, err = _finish(consumer)
    assert (consumer.returncode, out) == (0, "pulled\n"), err
    assert not target.exists()



# -- the rule itself (view.Runs), without namespaces -----------------------------------------

CONN = "exp1:restarts"
A = ("exp1", "a")


def _runs() -> Runs:
    return Runs()


def _state(version: int, live: int, ended: int, instance: str = "i1") -> dict[str, str]:
    return {"instance": instance, "version": str(version), "conns": f"restarts+{live}+{ended}"}


def test_runs_a_round_ended_on_another_host_after_the_consumers_last_run_is_finished():
    runs = _runs()
    consumer = Peer(id=1, component="post", pid=0)
    runs.start(consumer, [], [CONN])
    runs.peer_gone(consumer)                     # round 0's consumers are done
    assert not runs.finished(CONN)               # no producer run seen: wait
    assert runs.remote(A, _state(1, 1, 0)) == [
        "host a: connection restarts: 1 producer run live, 0 ended"]
    assert not runs.finished(CONN)               # running on a: wait
    runs.remote(A, _state(2, 0, 1))
    assert runs.finished(CONN)                   # ended after the consumers' last run
    assert runs.remote(A, _state(1, 1, 0)) == []  # an older state arriving late: ignored
    assert runs.finished(CONN)
    runs.start(consumer2 := Peer(id=2, component="post", pid=0), [], [CONN])
    runs.peer_gone(consumer2)                    # this round's consumers read it
    assert not runs.finished(CONN)               # the next round's consumer waits


def test_runs_a_dead_host_breaks_only_the_connections_it_was_producing():
    runs = _runs()
    runs.remote(A, {"instance": "i1", "version": "3", "conns": "restarts+1+0,obs+0+2"})
    assert runs.broken(CONN) == (0, "")
    assert runs.origin_gone(A, died=True) == [CONN]
    generation, why = runs.broken(CONN)
    assert generation == 1 and "host a's daemon died" in why
    assert runs.broken("exp1:obs") == (0, "")
    assert not runs.knows(A)
    runs.remote(A, _state(1, 1, 0, instance="i2"))  # a new daemon there: believed again
    assert runs.origin_gone(A, died=False) == []    # BYE: forgotten, nothing broken
    assert runs.broken(CONN)[0] == 1


def test_runs_summary_counts_only_this_experiments_producers_here():
    runs = _runs()
    told = []
    runs.on_change = told.append
    producer = Peer(id=7, component="model", pid=0)
    runs.start(producer, [CONN, "local:other"], [])
    assert told == [{"exp1", "local"}]
    assert runs.summary("exp1")["conns"] == "restarts+1+0"
    runs.peer_gone(producer)
    assert runs.summary("exp1")["conns"] == "restarts+0+1"
    assert int(runs.summary("exp1")["version"]) == 2 and len(told) == 2
