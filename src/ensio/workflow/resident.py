"""A resident analysis: one MPI job that runs every cycle's analysis (``workflow.resident``).

Why: an analysis task is a fresh ``mpiexec -n R python -m ensio analyse`` per
cycle, and before it reads a byte every rank starts an interpreter, imports
numpy, scipy, numba, h5py, netCDF4 and ensio and loads numba's cached kernels
(about 0.8 s per rank), and afterwards tears them down. With a small fast model
on a busy machine that is most of what the analysis adds to a cycle (the Veros
OSSE: 1.6 of 2.3 CPU-seconds per rank). With ``workflow.resident: true`` the
driver of ``ensio cycle`` starts the analysis program once
(:class:`Resident`, ``python -m ensio.cli.resident SOCKET`` under ``mpiexec``) and
each cycle's analysis task runs this module's client instead:

    python -m ensio.workflow.resident SOCKET -- mpiexec -n 2 python -m ensio analyse CFG …

The client (standard library only, ~20 ms) connects to the Unix socket, sends
the arguments after ``analyse``, its working directory and its ``ENSIO_*``
variables, passes its standard output and error along (``SCM_RIGHTS``), so the
analysis prints into the task's log as if it ran there, and exits with the
analysis' status. Nothing else about the task changes: the worker leases,
fences, records and commits it as before, and the analysis is the same
``ensio analyse`` code under the same lock, transaction and run record. When
no resident answers (not started, died, stopped), the client ``exec``s the
command after ``--``: a cold start, never a failure.

Faults: the resident serves one analysis at a time (later clients wait in the
socket's backlog). A client killed mid-run (its job's time limit) leaves the
analysis running to its commit or rollback; the retried task then finds the
members already hold it (the run record). A resident that dies mid-run is like
a killed ``ensio analyse``: its client exits 1, the task is retried (cold, or
on a resident the driver restarted before the next cycle), and the ensemble
lock's recovery rolls the interrupted transaction back. Any error that is not
an ordinary ``ensio`` error ends the resident (``MPI_Abort``) rather than leave
ranks out of step. The resident ends when the driver stops it, or when the
driver dies (its standard input, a pipe from the driver, ends).

Security: the socket is in a fresh 0700 directory, and the resident serves
only peers of its own uid (``SO_PEERCRED``).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .prestart import close_and_reap

__all__ = ["Resident", "client_argv", "main", "recv_request", "send_request"]

_HEADER = struct.Struct("!I")
#: Variables a request carries: the task's (``ENSIO_TASK``, ``ENSIO_REPORT``, …).
ENV_PREFIX = "ENSIO_"


def send_request(sock: socket.socket, request: dict[str, Any], fds: Sequence[int] = ()) -> None:
    """One length-prefixed JSON message, with ``fds`` attached to its first bytes."""
    body = json.dumps(request).encode()
    data = _HEADER.pack(len(body)) + body
    sent = socket.send_fds(sock, [data], list(fds)) if fds else sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])


def recv_request(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """The message of :func:`send_request` and the descriptors it carried (None at EOF)."""
    data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, max_fds)
    if not data:
        return None, fds
    while len(data) < _HEADER.size:
        more = sock.recv(1 << 16)
        if not more:
            return None, fds
        data += more
    (n,) = _HEADER.unpack_from(data)
    while len(data) < _HEADER.size + n:
        more = sock.recv(1 << 16)
        if not more:
            return None, fds
        data += more
    return json.loads(data[_HEADER.size:_HEADER.size + n]), fds


def peer_uid(sock: socket.socket) -> int:
    """uid of the process at the other end of a Unix socket (``SO_PEERCRED``)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def client_argv(sock_path: str | Path, argv: Sequence[str]) -> list[str]:
    """The task command that asks the resident at ``sock_path`` to run ``argv``."""
    return [sys.executable, "-m", "ensio.workflow.resident", str(sock_path), "--", *argv]


def _analyse_args(argv: Sequence[str]) -> list[str] | None:
    """The arguments after ``analyse`` of ``… -m ensio analyse ARGS`` (None: not that)."""
    for i in range(len(argv) - 1):
        if argv[i] == "ensio" and i and argv[i - 1] == "-m" and argv[i + 1] == "analyse":
            return list(argv[i + 2:])
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """The client: run ``COMMAND`` on the resident at ``SOCKET``, else ``exec`` it."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m ensio.workflow.resident SOCKET -- COMMAND…", file=sys.stderr)
        return 2
    path, command = args[0], args[2:]
    analyse = _analyse_args(command)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if analyse is None:
            raise OSError("not an ensio analyse command")
        sock.connect(path)
    except OSError:
        sock.close()
        os.execvp(command[0], command)  # no resident: the cold start
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    sys.stdout.flush()
    sys.stderr.flush()
    send_request(sock, {"argv": analyse, "cwd": os.getcwd(), "env": env}, [1, 2])
    reply = b""
    while not reply.endswith(b"\n"):
        more = sock.recv(4096)
        if not more:
            print(f"ensio: the resident analysis at {path} ended during the run",
                  file=sys.stderr)
            return 1
        reply += more
    return int(json.loads(reply)["code"])


@dataclass
class Resident:
    """The driver's handle on a resident analysis.

    ``launcher`` runs the ranks (e.g. ``mpiexec -n 2``; empty: one rank);
    output between analyses goes to ``log``. The socket lives in a fresh
    0700 directory (a short path: Unix socket paths are limited to 107 bytes).
    """

    launcher: tuple[str, ...]
    log: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen | None = None
    _socket: Path | None = field(default=None, init=False, repr=False)

    @property
    def socket(self) -> Path:
        """The socket's path; its directory is made when first asked for (a driver killed
        before its first cycle leaves none behind)."""
        if self._socket is None:
            self._socket = Path(tempfile.mkdtemp(prefix="ensio-resident-")) / "s"
        return self._socket

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def launch(self, warm: Path | None = None) -> None:
        """Start ``LAUNCHER python -m ensio.cli.resident SOCKET [--warm CONFIG]``.

        Not waited for: it listens once its imports are done (a client that
        comes earlier starts cold). ``warm``: an analysis config whose filter
        it loads ahead (numba's kernels, scipy's k-d tree). Its standard input
        is a pipe from this process, so it ends when we do.
        """
        self.log.parent.mkdir(parents=True, exist_ok=True)
        argv = [*self.launcher, sys.executable, "-m", "ensio.cli.resident", str(self.socket)]
        if warm is not None:
            argv += ["--warm", str(warm)]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out,
                                         stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True)

    def stop(self, timeout: float = 30.0) -> None:
        """Ask it to end (after a running analysis), then wait; kill it if it does not."""
        if self.proc is not None:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.settimeout(timeout)
                    sock.connect(str(self.socket))
                    send_request(sock, {"stop": True})
                    sock.recv(16)
            except OSError:
                pass
            close_and_reap(self.proc, timeout)
        if self._socket is not None:
            self._socket.unlink(missing_ok=True)
            try:
                self._socket.parent.rmdir()
            except OSError:
                pass


if __name__ == "__main__":
    raise SystemExit(main())
