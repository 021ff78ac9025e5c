"""Unlink and rename follow a transferred file to the hosts that hold copies of it.

A producer host's daemon keeps one *control* connection (:mod:`.wire`, first frame
``CONTROL``) to each consumer host it streams files to, opened before the first
stream, and remembers which hosts hold (or are receiving) a copy of each path. When
a producer unlinks or renames a transferred path, the daemon sends ``UNLINK path=``
or ``RENAME old= new=`` on each of those hosts' control connections and waits for
their ``OK`` (at most :data:`NOTIFY_S` per host) before the producer's call returns:
an open on any host that starts after the producer's ``unlink``/``rename`` returned
sees the new names. Sync and async connections behave alike (an async file is
complete on every host when its producer's close returns, so there is nothing in
flight to rename).

The rule that keeps a host that missed a notification from serving stale copies:
**a consumer host serves the copies it received from a host only while that host's
control connection is open.** A producer daemon that cannot get an answer in time
says ``GIVEUP`` and shuts the connection down: every copy from it is then marked lost
on the consumer host (new opens get ``EIO`` and a log line; readers that have it open
keep their sealed bytes). A connection that just ends (a killed producer daemon, or
TCP keepalive declaring the peer gone after a partition) loses only the copies still
arriving: a dead daemon renames and unlinks nothing more. A producer daemon that
stops normally says ``BYE``: its copies are dropped on the other hosts (new opens see
the real files there, as they do on the producer's host once its daemon is gone). A
consumer host's daemon reads whatever is pending on its control connections (frames,
or their end) before it answers each open or stat, so a daemon that was stopped and
resumes applies the notifications (or the loss) before it serves anything.

A copy arriving on a stream is accepted only while a control connection from its
host is open (else the stream is refused and logged by the sender).

Producer runs (issue 28 item 1 across hosts, :class:`.view.Runs`): a consumer waits
for a name not produced yet unless the connection's producer has finished its round,
and its producers may run on other hosts. So every daemon tells the other hosts of
an experiment its producer runs whenever a connection's producer starts (none live
→ one) or ends a round: ``RUNS instance= version= conns=NAME+LIVE+ENDED,...`` on its
control connection, pushed without an answer (a stopped host must not hold up the
unlinks behind it; a push that fails ends the connection, and the other host then
asks again). Before a consumer's wait the consumer host asks every other host
(``RUNS ask=1 path=``, with its own runs): the answer is ``OK`` with the other's runs
and ``held=1`` when it holds ``path`` complete (then the file was not for this host,
or this host's copy was lost with its daemon: not waited for). Asking before each wait
also covers a consumer daemon started after the producer's round ended. A host whose
control connection ends without a word (either direction: :meth:`Names._watch`
watches ours) while one of its producer runs was live ends the waits for that
connection with ``EIO``; ``BYE`` or ``GIVEUP`` only forget its runs (asked again at the
next wait); a host whose daemon died with no producer run live ends no wait (its next
producer starts a new daemon, which tells us). ``UNLINK`` and ``RENAME`` carry
``producer=1 conns=C,...`` when a producer of those connections removed the name: their
consumers do not wait for it there either (``mv x.tmp x``). The producer counts as
finished only once every host the config places it on has ended a round
(:meth:`.view.Runs.place`): a host that cannot be asked before a wait is logged and
waited for.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import select
import socket
import threading
from collections.abc import Callable

from .protocol import Message
from .table import Reply, Table
from .view import Runs, held_complete
from .wire import recv_frame, send_frame

__all__ = ["NOTIFY_S", "Names", "origin_key"]

NOTIFY_S = 5.0   # how long a producer's unlink/rename waits for each other host's answer

Target = tuple[str, str]   # (experiment identity, host name)


class _Incoming:
    """A control connection from a producer host, on the consumer host."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self.ended = False


class Names:
    """Both sides of the control connections of one daemon.

    ``connect(identity, host)`` opens an authenticated connection to ``host``'s daemon
    for experiment ``identity`` (raising OSError), as :class:`~.network.Network` does
    for streams.
    """

    def __init__(self, table: Table, log: logging.Logger,
                 connect: Callable[[str, str], socket.socket]) -> None:
        self.table = table
        self.log = log
        self.connect = connect
        self.lock = threading.Lock()
        self.holders: dict[str, set[Target]] = {}        # path → hosts with a copy
        self.controls: dict[Target, socket.socket] = {}  # producer side
        self._target_locks: dict[Target, threading.Lock] = {}
        self.incoming: dict[Target, _Incoming] = {}      # consumer side
        self.runs = Runs()   # producer runs here and on the other hosts (view.py)
        self._dirty: set[Target] = set()      # hosts to tell our producer runs again
        self._pushing: set[Target] = set()    # hosts a thread is telling them now

    # -- producer host ---------------------------------------------------------------------

    def ensure(self, target: Target) -> bool:
        """A control connection to ``target`` is open (opened now if needed)."""
        with self._lock_of(target):
            return self._control(target) is not None

    def note(self, path: str, targets: list[Target]) -> None:
        """``targets`` hold (or are receiving) a copy of ``path``."""
        if targets:
            with self.lock:
                self.holders.setdefault(path, set()).update(targets)

    def unlink(self, path: str, only: Target | None = None,
               producer: tuple[str, ...] = ()) -> None:
        """``path`` is gone here: every host holding a copy drops it (``only``: that one).
        ``producer``: the connections of the producer that removed it
        (:meth:`.view.Runs.removed` there too)."""
        with self.lock:
            held = self.holders.get(path, set())
            targets = {only} & held if only is not None else set(held)
            held -= targets
            if not held:
                self.holders.pop(path, None)
        for t in sorted(targets):
            self._tell(t, "UNLINK", path=path, **_removed_by(producer))

    def rename(self, old: str, new: str, producer: tuple[str, ...] = ()) -> None:
        """``old`` is now ``new`` here; hosts holding either name follow."""
        with self.lock:
            moved = self.holders.pop(old, set())
            replaced = self.holders.pop(new, set())
            if moved:
                self.holders[new] = set(moved)
        for t in sorted(moved | replaced):
            self._tell(t, "RENAME", old=old, new=new, **_removed_by(producer))

    # -- producer runs, both ways (view.Runs) ----------------------------------------------

    def tell_runs(self, identity: str, hosts: list[str]) -> None:
        """Our producer runs of ``identity`` changed: tell ``hosts`` (in the background, a
        thread per host at a time; a host still being told is told again after)."""
        for host in hosts:
            target = (identity, host)
            with self.lock:
                self._dirty.add(target)
                if target in self._pushing:
                    continue
                self._pushing.add(target)
            threading.Thread(target=self._push, args=(target,), daemon=True,
                             name=f"runs-{host}").start()

    def _push(self, target: Target) -> None:
        """Tell ``target`` our producer runs until nothing changed meanwhile. No answer is
        waited for (a stopped host must not hold up the unlinks queued behind): a push
        that is lost ends the connection, and the other host then asks again."""
        while True:
            with self.lock:
                if target not in self._dirty:
                    self._pushing.discard(target)
                    return
                self._dirty.discard(target)
            with self._lock_of(target):
                sock = self._control(target, quiet=True)
                if sock is None:
                    continue
                try:
                    send_frame(sock, "RUNS", **self.runs.summary(target[0]))
                except OSError:
                    self._end(target)

    def ask(self, target: Target, path: str = "") -> bool | None:
        """``RUNS ask=1`` to ``target``: its producer runs (our own go with the question),
        and whether it holds ``path`` complete. None if it cannot be reached."""
        reply = self._tell(target, "RUNS", quiet=True, ask=1, path=path,
                           **self.runs.summary(target[0]))
        if reply is None:
            return None
        for line in self.runs.remote(target, reply.fields):
            self.log.info("%s", line)
        return reply.get("held") == "1"

    def hear_from(self, identity: str, hosts: list[str], path: str
                  ) -> tuple[str | None, list[str]]:
        """Before a consumer's wait for ``path``: ask each of ``hosts`` (in case our daemon
        started after theirs had finished a round, or a push was lost), all at once: a
        host that does not answer costs one connection timeout, not one each. The first
        host that holds ``path`` complete, else None (a file complete there and not here
        was not for this host, or its copy here was lost: our daemon restarted); and the
        hosts that could not be asked."""
        held: list[bool | None] = [False] * len(hosts)

        def ask(i: int) -> None:
            held[i] = self.ask((identity, hosts[i]), path)

        threads = [threading.Thread(target=ask, args=(i,), daemon=True)
                   for i in range(len(hosts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return (next((h for h, yes in zip(hosts, held, strict=True) if yes), None),
                [h for h, yes in zip(hosts, held, strict=True) if yes is None])

    def _runs_gone(self, origin: Target, died: bool) -> None:
        """``origin``'s daemon stopped or died: its runs are forgotten, and when it died
        the waits for what its live producers were writing end (view.await_name).

        A daemon that died with no producer run live ends no wait: nothing was being
        written there, and the next ``ensio run`` of a producer there starts a new daemon
        that tells this host its runs (and streams the file) as the dead one would have.
        Until then that host counts as not having ended its round."""
        known = self.runs.knows(origin)   # (both connections may end: say it once)
        broken = self.runs.origin_gone(origin, died)
        if broken:
            with self.table.cond:
                self.table.cond.notify_all()
        elif died and known:
            self.log.info("host %s: no producer run was live there: waits for its files go "
                          "on (a producer started there again reports here)", origin[1])

    def _lock_of(self, target: Target) -> threading.Lock:
        with self.lock:
            return self._target_locks.setdefault(target, threading.Lock())

    def _control(self, target: Target, quiet: bool = False) -> socket.socket | None:
        """(target lock held) The open control connection, or a new one; None if unreachable
        (``quiet``: logged as information: a host not up yet learns our runs when it asks)."""
        sock = self.controls.get(target)
        if sock is not None:
            try:  # nothing is due on it: readable means closed (the other daemon restarted)
                stale = bool(select.select([sock], [], [], 0)[0])
            except (OSError, ValueError):
                stale = True
            if not stale:
                return sock
            self._end(target)
        sock = None
        try:
            sock = self.connect(*target)
            sock.settimeout(NOTIFY_S)
            send_frame(sock, "CONTROL")
            reply = recv_frame(sock)
            if reply is None or reply.verb != "OK":
                raise OSError(errno.EPROTO, "refused the control connection")
        except OSError as exc:
            if sock is not None:
                sock.close()
            if quiet:
                self.log.info("host %s: no control connection (%s)", target[1],
                              exc.strerror or exc)
            else:
                self.log.error("host %s: no control connection (%s): renames and unlinks "
                               "cannot reach it", target[1], exc.strerror or exc)
            return None
        self.controls[target] = sock
        threading.Thread(target=self._watch, args=(target, sock), daemon=True,
                         name=f"watch-{target[1]}").start()
        return sock

    def _watch(self, target: Target, sock: socket.socket) -> None:
        """Our control connection to ``target``, between requests: nothing is due on it,
        so readable means the other daemon closed it (it died, or stopped). Its producer
        runs are gone then (the waits for what they were writing end): that host may
        have told us of them only on this connection."""
        while True:
            with contextlib.suppress(OSError, ValueError):
                select.select([sock], [], [], 1.0)
            with self._lock_of(target):  # a request in flight holds it until its answer
                if self.controls.get(target) is not sock:
                    return
                try:
                    if not select.select([sock], [], [], 0)[0]:
                        continue
                except (OSError, ValueError):
                    pass
                self.controls.pop(target, None)
                sock.close()
            self.log.warning("host %s closed our control connection (its daemon stopped or "
                             "died)", target[1])
            self._runs_gone(target, died=True)
            return

    def _tell(self, target: Target, verb: str, quiet: bool = False,
              **fields: object) -> Message | None:
        """One operation on ``target``, acknowledged (the ``OK``), or its control connection
        ends (and with it, on that host, every copy from here): None. Never waits past
        NOTIFY_S per attempt; a connection found dead is reopened once (the other daemon
        restarted)."""
        what = " ".join(f"{k}={v}" for k, v in fields.items())
        with self._lock_of(target):
            for attempt in (0, 1):
                fresh = target not in self.controls
                sock = self._control(target, quiet)
                if sock is None:
                    return None
                try:
                    send_frame(sock, verb, **fields)
                    reply = recv_frame(sock)
                except TimeoutError:
                    reply, fresh = None, True   # alive but not answering: do not retry
                except OSError:
                    reply = None
                if reply is not None and reply.verb == "OK":
                    return reply
                self._end(target)
                if fresh or attempt:
                    self.log.error("host %s did not acknowledge %s %s: its copies from this "
                                   "host are marked lost there", target[1], verb, what)
                    return None
        return None

    def _end(self, target: Target) -> None:
        """(target lock held) Give the control connection up (``GIVEUP``, best effort,
        then shut it down): the other host, when it reads that, marks every copy from
        here lost, since a rename or unlink may have been missed. A connection that just
        ends (this daemon died) loses only the copies still arriving there."""
        sock = self.controls.pop(target, None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.settimeout(0.2)  # a stopped peer's full buffer must not hold us up
                send_frame(sock, "GIVEUP")
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        """Daemon exit: ``BYE`` on every control connection (the other hosts drop our copies)."""
        with self.lock:
            controls = list(self.controls.items())
            self.controls.clear()
            incoming = list(self.incoming.values())
        for _, sock in controls:
            with contextlib.suppress(OSError):
                send_frame(sock, "BYE")
            sock.close()
        for ctl in incoming:
            with contextlib.suppress(OSError):
                ctl.sock.shutdown(socket.SHUT_RDWR)

    # -- consumer host ---------------------------------------------------------------------

    def live(self, origin: Target) -> bool:
        """Whether a control connection from ``origin`` is open (copies may be accepted)."""
        self.drain()
        with self.lock:
            ctl = self.incoming.get(origin)
        return ctl is not None and not ctl.ended

    def serve(self, sock: socket.socket, origin: Target) -> None:
        """A producer host's control connection, until it ends (in its own thread)."""
        sock.settimeout(NOTIFY_S)  # a frame is small: one that stalls half-read is a loss
        ctl = _Incoming(sock)
        with self.lock:
            old = self.incoming.get(origin)
        if old is not None:  # the producer reconnected: settle the old connection first
            with old.lock:
                self._pump(origin, old)
        with self.lock:
            self.incoming[origin] = ctl
        try:
            with ctl.lock:
                send_frame(sock, "OK")
            while not ctl.ended:
                with contextlib.suppress(OSError, ValueError):
                    select.select([sock], [], [])
                with ctl.lock:
                    self._pump(origin, ctl)
        finally:
            with ctl.lock:
                if not ctl.ended:  # gone without a word (an error here): as an end
                    self._lost(origin, ctl)
            with self.lock:
                if self.incoming.get(origin) is ctl:
                    del self.incoming[origin]

    def drain(self) -> None:
        """Apply what every control connection has pending (before an open is answered)."""
        with self.lock:
            pending = list(self.incoming.items())
        for origin, ctl in pending:
            with ctl.lock:
                self._pump(origin, ctl)

    def _pump(self, origin: Target, ctl: _Incoming) -> None:
        """(ctl.lock held) Apply the frames that arrived, and the connection's end."""
        while not ctl.ended:
            try:
                ready, _, _ = select.select([ctl.sock], [], [], 0)
                if not ready:
                    return
                m = recv_frame(ctl.sock)
            except (OSError, ValueError):
                m = None
            if m is None:
                self._lost(origin, ctl)
            elif m.verb == "GIVEUP":
                ctl.ended = True
                self.table.lose_origin(origin_key(origin), f"lost contact with host "
                                       f"{origin[1]}, which gave up on us (a rename or unlink "
                                       "there may not have reached us)", everything=True)
                self._runs_gone(origin, died=False)  # what it told us may be stale: ask again
            elif m.verb == "BYE":
                ctl.ended = True
                n = self.table.lose_origin(origin_key(origin), "", drop=True)
                if n:
                    self.log.warning("host %s's daemon stopped: the copies of its files "
                                     "here are dropped (%d; new opens see the real files)",
                                     origin[1], n)
                self._runs_gone(origin, died=False)
            else:
                reply = self._apply(m, origin)
                if m.verb == "RUNS" and m.get("ask") != "1":
                    continue  # a push: no answer
                try:
                    send_frame(ctl.sock, reply.verb, **reply.fields)
                except OSError:
                    continue  # the next read finds the end

    def _lost(self, origin: Target, ctl: _Incoming) -> None:
        """(ctl.lock held) The connection ended without ``BYE`` or ``GIVEUP``: its host's
        daemon died. The copies still arriving are lost; complete ones stay served (their
        bytes are whole, and a dead daemon renames and unlinks nothing more)."""
        ctl.ended = True
        n = self.table.lose_origin(origin_key(origin), f"lost contact with host {origin[1]} "
                                   "(its daemon died) before the file was complete")
        self.log.warning("lost contact with host %s: %d incomplete copies from it are lost; "
                         "complete ones stay served", origin[1], n)
        self._runs_gone(origin, died=True)

    def _apply(self, m: Message, origin: Target) -> Reply:
        if m.verb == "RUNS":  # its producer runs; asked: ours, and whether we hold path
            for line in self.runs.remote(origin, m.fields):
                self.log.info("%s", line)
            held = held_complete(self.table, m.get("path")) if m.get("path") else False
            return Reply("OK", {**self.runs.summary(origin[0]), "held": int(held)})
        if m.get("producer") == "1":  # its producer removed the name: not waited for here
            self.runs.removed(m.get("path") or m.get("old"),
                              [c for c in m.get("conns").split(",") if c] or ["*"])
        if m.verb == "UNLINK":
            self.table.drop(m.get("path"))
            return Reply("OK")
        if m.verb == "RENAME":
            self.table.rename(m.get("old"), m.get("new"), export=False, copy=True)
            return Reply("OK")
        return Reply.err(errno.ENOSYS)


def _removed_by(conns: tuple[str, ...]) -> dict[str, object]:
    """The fields saying which producer removed a name: ``producer=1`` and its connections
    (tombstones are per connection, :meth:`.view.Runs.removed`)."""
    return {"producer": 1, "conns": ",".join(conns)} if conns else {"producer": 0}


def origin_key(origin: Target) -> str:
    """The ``origin`` a held copy records (:class:`~.table.Entry`)."""
    return f"{origin[0]}@{origin[1]}"

