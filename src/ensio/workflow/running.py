"""A started task's command: its process, its exit noticed by a thread, its group stopped.

Split out of :mod:`ensio.workflow.worker`, which decides what runs when; this is
only how one command's process is watched and ended. Commands run in a session
of their own (``start_new_session``), so stopping one reaches every process it
started (``mpiexec`` and its ranks, a model's helpers) through its process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .leases import Lease
from .spec import TaskCommand

__all__ = ["Running"]


@dataclass
class Running:
    """A started task: its lease, command, process and record (filled as it runs)."""

    lease: Lease
    cmd: TaskCommand
    proc: subprocess.Popen
    rec: dict[str, Any]
    exited: threading.Event = field(default_factory=threading.Event)

    def watch(self, wake: threading.Event) -> Running:
        """A thread that notes the command's exit time and sets ``wake``."""

        def wait() -> None:
            self.proc.wait()
            self.rec["ended"] = time.time()  # the exit itself, not when the loop sees it
            self.exited.set()
            wake.set()

        threading.Thread(target=wait, name=f"wait-{self.lease.task}", daemon=True).start()
        return self

    def stop(self, grace: float) -> None:
        """SIGTERM the command's process group, SIGKILL it after ``grace`` seconds."""
        proc = self.proc
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            if self.exited.wait(wait):
                break
        proc.wait()
        self.exited.wait()
        self.rec["exit"] = proc.returncode
        try:  # stragglers of the group (the leader is gone)
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
