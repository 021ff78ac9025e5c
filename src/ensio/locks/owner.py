"""Who holds a lock: the one owner record of every ensio lock.

The ensemble lock (:mod:`.ensemble`) and the mkdir fallback of the blocking
lock (:mod:`.filelock`) write the same record (:class:`Holder`: host, pid, the
pid's start time in clock ticks since boot, the boot id, the UTC start time,
the command and the run), so a lock of either kind is told live or dead the
same way and named the same way in a message (:meth:`Holder.describe`).

Standard library only: worker jobs import it at start-up.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["Holder", "command_line", "process_start", "run_id"]


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22), or None.

    None if there is no such process (or no ``/proc``).
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def run_id() -> str:
    """This process as the identity of a run: ``host:pid:start``.

    An MPI run takes its rank 0's (broadcast), so every lock its ranks take
    names the same run; unique while the process lives (the start time
    tells a reused pid apart).
    """
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{process_start(pid)}"


@dataclass(frozen=True)
class Holder:
    """Who holds a lock (the lock file's record); ``run``: its run (:func:`run_id`), or ""."""

    host: str
    pid: int
    pid_start: int | None
    boot_id: str
    started: str
    command: str
    run: str = ""

    @classmethod
    def current(cls, command: str, run: str = "") -> Holder:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, process_start(pid), _boot_id(),
                   time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), command, run)

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        try:
            raw = json.loads(text)
            return cls(str(raw["host"]), int(raw["pid"]), raw.get("pid_start"),
                       str(raw.get("boot_id", "")), str(raw["started"]), str(raw["command"]),
                       str(raw.get("run", "")))
        except (ValueError, KeyError, TypeError):
            return None

    def encode(self) -> bytes:
        return (json.dumps(asdict(self)) + "\n").encode()

    def describe(self) -> str:
        return (f"`{self.command}` (host {self.host}, pid {self.pid}, "
                f"started {self.started})")

    def is_local(self) -> bool:
        return self.host == socket.gethostname()

    def alive(self) -> bool:
        """This host's process of the record still runs (same pid, start time and boot)."""
        if self.boot_id and _boot_id() and self.boot_id != _boot_id():
            return False
        start = process_start(self.pid)
        if start is None:
            return False
        return self.pid_start is None or start == self.pid_start


def command_line() -> str:
    """This process's command, as recorded in a lock (``ensio analyse cfg.yaml``)."""
    argv = [os.path.basename(sys.argv[0]) if sys.argv else "python", *sys.argv[1:]]
    if argv[0] in ("__main__.py", "-m"):
        argv[0] = "ensio"
    return " ".join(argv)[:500]
