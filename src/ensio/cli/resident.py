"""``python -m ensio.cli.resident SOCKET``: the resident analysis program (every rank).

What it is for, its client and its faults: :mod:`ensio.workflow.resident`.
Rank 0 listens on the Unix socket and waits for a client or for its standard
input to end (the driver gone); the other ranks wait asleep (MPICH spins
inside a blocking collective, and the members run beside us). Each request is
``ensio analyse ARGS`` run through :func:`ensio.cli.main.main` on every rank,
with the client's working directory and ``ENSIO_*`` variables, rank 0's
standard output and error being the client's. An exception that is not an
ordinary command error aborts the job, so no rank is left in a collective.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from mpi4py import MPI

from ..parallel.abort import abort_job
from ..workflow.resident import ENV_PREFIX, peer_uid, recv_request


def _wait_quietly(comm: MPI.Comm) -> None:
    """A barrier the waiting ranks sleep through (no busy polling)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.005)


@contextlib.contextmanager
def _task_env(env: Mapping[str, str], cwd: str) -> Iterator[None]:
    """The client's ``ENSIO_*`` variables and directory for one request, then ours again."""
    saved = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    here = os.getcwd()
    for k in saved:
        del os.environ[k]
    os.environ.update({k: v for k, v in env.items() if k.startswith(ENV_PREFIX)})
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(here)
        for k in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
            del os.environ[k]
        os.environ.update(saved)


@contextlib.contextmanager
def _stdio(fds: list[int]) -> Iterator[None]:
    """Standard output and error on the client's descriptors for one request."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    for fd, target in zip(fds, (1, 2), strict=True):
        os.dup2(fd, target)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, target in zip(saved, (1, 2), strict=True):
            os.dup2(fd, target)
            os.close(fd)


def _next_request(srv: socket.socket) -> tuple[dict[str, Any] | None, socket.socket | None,
                                               list[int]]:
    """Rank 0: the next request from a peer of our uid (``{"stop": True}`` at stdin's end)."""
    while True:
        ready, _, _ = select.select([srv, sys.stdin], [], [])
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1 << 12):
            return {"stop": True}, None, []
        if srv not in ready:
            continue
        conn, _ = srv.accept()
        if peer_uid(conn) != os.getuid():
            print("ensio resident: refused a client of another uid", file=sys.stderr)
            conn.close()
            continue
        try:
            request, fds = recv_request(conn, max_fds=2)
        except (OSError, ValueError):
            conn.close()
            continue
        if request is None or not request.get("stop") and len(fds) != 2:
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        return request, conn, fds


def _run(argv: list[str]) -> int:
    from .main import main

    try:
        return main(["analyse", *argv])
    except SystemExit as exc:  # argparse
        return exc.code if isinstance(exc.code, int) else 2


def serve(path: Path, comm: MPI.Comm, warm: Path | None = None) -> None:
    """Collective: serve analyses until told to stop; ``warm``: an analysis config whose
    filter is loaded first (clients that come meanwhile wait in the backlog)."""
    from ..analysis.warm import warm_for
    from ..config import load_config
    from ..offline import run_analysis  # noqa: F401  (what every request needs)

    srv = None
    if comm.rank == 0:
        path.unlink(missing_ok=True)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(str(path))
        os.chmod(path, 0o600)
        srv.listen(16)
        print(f"ensio resident: {comm.size} rank(s) listening on {path}", flush=True)
    if warm is not None:
        try:
            config = load_config(warm)
            if config.analysis is not None:
                warm_for(config.analysis, config.ensemble.size)
        except Exception as exc:  # each request reports its own config's errors
            print(f"ensio resident: warm-up with {warm} failed: {exc}", flush=True)
    while True:
        conn, fds, request = None, [], None
        if comm.rank == 0:
            assert srv is not None
            request, conn, fds = _next_request(srv)
        _wait_quietly(comm)
        request = comm.bcast(request, root=0)
        assert request is not None
        if request.get("stop"):
            if conn is not None:
                conn.sendall(b'{"code": 0}\n')
                conn.close()
            break
        code = 1
        try:
            with _task_env(request["env"], request["cwd"]), \
                    (_stdio(fds) if comm.rank == 0 else contextlib.nullcontext()):
                code = _run(list(request["argv"]))
        except Exception:  # not an agreed command error: ranks may be out of step
            traceback.print_exc()
            abort_job(comm, 1)
        finally:
            for fd in fds:
                os.close(fd)
        if conn is not None:
            try:
                conn.sendall(f'{{"code": {int(code)}}}\n'.encode())
            except OSError:
                pass  # the client was killed; the analysis is committed or rolled back
            conn.close()
    if srv is not None:
        srv.close()
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the driver's 0700 directory, when it is gone
            path.parent.rmdir()


def main() -> int:
    args = sys.argv[1:]
    if len(args) not in (1, 3) or len(args) == 3 and args[1] != "--warm":
        print("usage: python -m ensio.cli.resident SOCKET [--warm CONFIG]", file=sys.stderr)
        return 2
    serve(Path(args[0]), MPI.COMM_WORLD, Path(args[2]) if len(args) == 3 else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
