"""Issue 28 item 1 across hosts: a consumer on host b started before its producer on a.

Two network namespaces (transfer_hosts.py), the producer component on a, the consumer
component on b. b's daemon learns a's producer runs over the control connection
between the daemons (``RUNS``, transfer/names.py), so a consumer on b waits as on one
host: for a name a's producer will write (it reads the file once a creates it), until
``consumer_timeout_s`` (ETIMEDOUT, logged on b), and not at all once a's producer run
has finished without the name (ENOENT at once). A wait ends with EIO, not the full
timeout, when a's daemon dies. That the consumer waits is proven by b's daemon's log
line, never by a sleep.

With the producer component placed on both hosts, the producer has finished only once
each of them has ended a round (the config's ``hosts`` says which, ``NETWORK
producers=``): a host whose producer has not started yet, or whose daemon is not up,
is waited for. A producer host whose daemon dies with no producer running ends no wait
(the next producer there brings a new daemon). Names a producer removed are not waited
for by that producer's connections only, and a pull that cannot reach a host says so
once per wait.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import needs
import pytest
from transfer_hosts import NetHost, hosts_config, two_hosts_fixture  # noqa: F401
from transfer_support import (  # noqa: F401  (the *_fixture names are fixtures)
    CDL,
    Host,
    daemon_pid,
    host_fixture,
    interposer_cache_fixture,
    process_gone,
    wait_for,
)

from ensio.transfer import view
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



# -- several producer hosts (the config's hosts place the producer on a and b) ---------------

BOTH = {"a": ["model"], "b": ["model", "post"]}   # N-1: model 0 on a, model 1 on b


@pytest.mark.usefixtures("interposer_cache")
def test_with_the_producer_on_both_hosts_one_hosts_end_is_not_the_end_of_the_round(
        two_hosts):
    """a's producer ended, b's has not started: a consumer on b waits for b's file (it
    used to get ENOENT: a producer had ended and none ran). Once both have ended a round,
    a name neither wrote is ENOENT at once."""
    a, b = two_hosts
    cfg = _config(a.work, BOTH, pattern="N-1")
    b.up(cfg, "post")                      # a consumer run ends before the round
    assert a.run(cfg, "model", "sh", "-c", "echo from a > fc/x.txt", rank=0).returncode == 0
    target = a.work / "fc" / "y.txt"
    consumer = b.start(cfg, "post", "cat", "fc/y.txt")
    try:
        _wait_logged(b, target, consumer)
        assert b.run(cfg, "model", "sh", "-c", "echo from b > fc/y.txt", rank=1).returncode == 0
    finally:
        out, err = _finish(consumer)
    assert (consumer.returncode, out) == (0, "from b\n"), err
    # the next round: both hosts' producers end after the consumers' last run
    assert a.run(cfg, "model", "true", rank=0).returncode == 0
    assert b.run(cfg, "model", "true", rank=1).returncode == 0
    r = b.run(cfg, "post", "cat", "fc/none.txt", timeout=30)
    assert r.returncode != 0 and "No such file" in r.stderr, r.stderr
    assert str(a.work / "fc" / "none.txt") not in b.log()


@pytest.mark.usefixtures("interposer_cache")
def test_a_producer_host_whose_daemon_is_not_up_is_waited_for_and_logged(two_hosts):
    """b's producer ended and a's daemon does not run yet: b cannot ask a, logs that a
    counts as not finished, and its consumer waits; a's producer then writes the file."""
    a, b = two_hosts
    cfg = _config(a.work, BOTH, pattern="N-1")
    assert b.run(cfg, "model", "sh", "-c", "echo from b > fc/y.txt", rank=1).returncode == 0
    target = a.work / "fc" / "x.txt"
    consumer = b.start(cfg, "post", "cat", "fc/x.txt")
    try:
        _wait_logged(b, target, consumer)
        lines = [x for x in b.log().splitlines() if "producer host a did not answer" in x]
        assert len(lines) == 1 and str(target) in lines[0], b.log()
        assert a.run(cfg, "model", "sh", "-c", "echo from a > fc/x.txt", rank=0).returncode == 0
    finally:
        out, err = _finish(consumer)
    assert (consumer.returncode, out) == (0, "from a\n"), err


@pytest.mark.usefixtures("interposer_cache")
def test_a_producer_daemon_that_dies_with_no_producer_running_ends_no_wait(two_hosts):
    """b's consumer waits; a's daemon (up, no producer running) is killed: b logs that the
    wait goes on, and the file a's next producer writes (a new daemon) is read."""
    a, b = two_hosts
    cfg = _config(a.work, {"a": ["model"], "b": ["post"]})
    a.up(cfg, "post")   # a's daemon listens; a consumer run there ends no producer round
    target = a.work / "fc" / "x.txt"
    consumer = b.start(cfg, "post", "cat", "fc/x.txt")
    try:
        _wait_logged(b, target, consumer)
        pid = daemon_pid(a.dir)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: "host a: no producer run was live there" in b.log(),
                 what="b seeing a's daemon die")
        assert consumer.poll() is None, consumer.communicate()
        assert a.run(cfg, "model", "sh", "-c", "echo again > fc/x.txt").returncode == 0
    finally:
        out, err = _finish(consumer)
    assert (consumer.returncode, out) == (0, "again\n"), err
    assert "stops waiting (EIO)" not in b.log()


# -- names a producer removed: per connection (one host) -----------------------------------

def _two_connections(work: Path, timeout_s: float) -> Path:
    """model → post (fc/*) and obs → post (ob/*)."""
    import yaml

    for d in ("fc", "ob"):
        (work / d).mkdir(exist_ok=True)
    conns = [{"name": "restarts", "from": "model", "to": "post", "files": ["fc/*"],
              "consumer_timeout_s": timeout_s},
             {"name": "obs", "from": "obs", "to": "post", "files": ["ob/*"],
              "consumer_timeout_s": timeout_s}]
    path = work / "t.yaml"
    path.write_text(yaml.safe_dump({"components": ["model", "obs", "post"],
                                    "connections": conns}))
    return path


def test_a_name_renamed_away_is_not_waited_for_after_another_connections_producer_starts(
        host: Host):
    """model (still running) did ``mv fc/x.tmp fc/x``; obs's producer then runs. A consumer
    of fc/x.tmp gets ENOENT at once: only a producer of ``restarts`` starting again makes
    the name waitable (it used to be any producer)."""
    cfg = _two_connections(host.work, timeout_s=5)
    model = host.start(cfg, "model", "sh", "-c",
                       "echo x > fc/x.tmp && mv fc/x.tmp fc/x && echo moved && read line")
    try:
        assert model.stdout.readline() == "moved\n", model.communicate()
        assert host.run(cfg, "obs", "sh", "-c", "echo o > ob/o.txt").returncode == 0
        r = host.run(cfg, "post", "cat", "fc/x.tmp", timeout=30)
        assert r.returncode != 0 and "No such file" in r.stderr, r.stderr
        assert WAITS not in host.log()
        assert host.run(cfg, "post", "cat", "fc/x").stdout == "x\n"
    finally:
        model.communicate("\n", timeout=60)


# -- a pull that cannot reach a host: once per wait (view.await_name) ----------------------

@pytest.mark.usefixtures("interposer_cache")
def test_an_all_to_all_wait_with_a_host_down_says_cannot_ask_once(two_hosts):
    """all-to-all, a's daemon not up: b's consumer pulls before its wait and at each poll
    of it, and times out; b's log says ``cannot ask host a`` once."""
    a, b = two_hosts
    cfg = _config(a.work, {"a": ["model"], "b": ["model"]}, timeout_s=3, pattern="all-to-all")
    assert b.run(cfg, "model", "true", rank=1).returncode == 0
    r = b.run(cfg, "post", "cat", "fc/x.txt", timeout=60)
    assert r.returncode != 0 and "Connection timed out" in r.stderr, r.stderr
    lines = [x for x in b.log().splitlines() if "cannot ask host a" in x]
    assert len(lines) == 1 and str(a.work / "fc" / "x.txt") in lines[0], b.log()


class _FakeTable:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.entries: dict[str, object] = {}


def test_a_polls_warning_is_logged_once_per_wait(tmp_path, monkeypatch, caplog):
    """Each poll logs ``cannot ask host a``; the wait ends after the third (a real file
    appears): one warning in the log, and the next wait logs it again."""
    monkeypatch.setattr(view, "PULL_POLL_S", 0.001)
    monkeypatch.setattr(view, "PULL_POLL_MAX_S", 0.001)
    log = logging.getLogger("test.transfer.once")
    path = tmp_path / "x.nc"
    for wait in (1, 2):
        polls: list[int] = []

        def poll(_left: float, path=path, polls=polls) -> None:
            polls.append(1)
            log.warning("%s: cannot ask host %s for it: %s", path, "a", "refused")
            if len(polls) == 3:
                path.write_text("")
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=log.name):
            code = view.await_name(_FakeTable(), log, Peer(id=wait, component="post", pid=0),
                                   str(path), CONN, 60.0, Runs(), poll)
        assert code == 0 and len(polls) == 3
        warned = [r for r in caplog.records if "cannot ask host" in r.getMessage()]
        assert len(warned) == 1, caplog.text
        path.unlink()
    assert not log.filters  # the filter goes with the wait


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


def test_runs_with_producer_hosts_every_host_must_end_a_round():
    runs = _runs()
    runs.place("exp1", "b", {CONN: frozenset({"a", "b"})})
    consumer = Peer(id=1, component="post", pid=0)
    runs.start(consumer, [], [CONN])
    runs.peer_gone(consumer)
    runs.remote(A, _state(1, 0, 1))              # a ended a round after the consumers
    assert not runs.finished(CONN) and runs.waiting_on(CONN) == ["b"]
    producer = Peer(id=2, component="model", pid=0)
    runs.start(producer, [CONN], [])
    runs.peer_gone(producer)                     # b's own producer ends
    assert runs.finished(CONN) and runs.waiting_on(CONN) == []
    runs.place("exp1", "b", {})                  # hosts not known: any host's end counts
    runs.start(consumer3 := Peer(id=3, component="post", pid=0), [], [CONN])
    runs.peer_gone(consumer3)
    runs.remote(A, _state(2, 0, 2))
    assert runs.finished(CONN)


def test_runs_tombstones_are_per_connection():
    runs = _runs()
    runs.removed("/w/fc/x.tmp", [CONN])
    assert runs.was_removed("/w/fc/x.tmp", CONN)
    assert not runs.was_removed("/w/fc/x.tmp", "exp1:obs")
    runs.start(Peer(id=1, component="obs", pid=0), ["exp1:obs"], [])
    assert runs.was_removed("/w/fc/x.tmp", CONN)      # another connection's producer
    runs.remote(A, _state(1, 1, 0))                    # a producer of CONN starts on a
    assert not runs.was_removed("/w/fc/x.tmp", CONN)
    runs.removed("/w/fc/y", ["*"])                     # an older host: every connection
    assert runs.was_removed("/w/fc/y", "exp1:obs")
    runs.start(Peer(id=2, component="model", pid=0), [CONN], [])
    assert not runs.was_removed("/w/fc/y", "exp1:obs")
