"""The link's own speed for ``ensio bench transfer``: raw TCP ``sendfile`` between the namespaces.

``tcp_fraction`` compares a two-namespace transfer with what the veth pair carries
at best: one TCP stream, the sender ``sendfile``-ing the same bytes (``files``
memory files of ``nbytes`` each, written before the clock starts) from the
producer's namespace, the receiver ``recv_into`` one reused buffer in the
consumer's namespace (the bytes are not kept: the link, not the memory, is
measured). The time is from just before the first ``sendfile`` to the receiver's
acknowledgement of the last byte (one ``CLOCK_MONOTONIC`` for both namespaces).

Both ends run as ``python -m ensio.bench.transfer_tcp ROLE …`` under ``ip netns
exec``; the receiver says ``ready`` once listening, so no sleep orders them.

:func:`sync_stream_seconds` is the daemons' stream alone, from a two-namespace sync
run: a sync close sends the whole file and returns once the other host sealed it, so
the sum of the producer's close calls is the time the stream took for all the bytes
(frames, round trips and seals included; the producer's writes and the consumer's
reads not). Raw TCP over it says whether the stream runs at the link's speed, where
``tcp_fraction`` (end to end) also counts the programs' own work on the same cores.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

__all__ = ["PORT", "raw_tcp_seconds", "sync_stream_seconds"]

PORT = 7791  # beside the daemons' 7790
_BUF = 4 << 20


def raw_tcp_seconds(prefix: dict[str, list[str]], addresses: tuple[str, str], nbytes: int,
                    files: int, timeout: float = 600.0) -> float:
    """Seconds to move ``files`` × ``nbytes`` over one TCP stream from the producer's
    namespace to the consumer's (``prefix[role]``: the argv that runs in it;
    ``addresses``: producer's, consumer's).

    Raises
    ------
    RuntimeError
        An end failed (its stderr's last line) or did not finish in ``timeout``.
    """
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    me = [sys.executable, "-m", "ensio.bench.transfer_tcp"]
    recv = subprocess.Popen([*prefix["consumer"], *me, "receive", addresses[1], str(PORT)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert recv.stdout is not None
        if recv.stdout.readline().strip() != "ready":
            recv.wait(timeout)
            raise RuntimeError(f"raw TCP receiver failed: {_last(recv.stderr.read())}")
        send = subprocess.run([*prefix["producer"], *me, "send", addresses[1], str(PORT),
                               str(nbytes), str(files)], capture_output=True, text=True,
                              env=env, timeout=timeout)
        if send.returncode != 0:
            raise RuntimeError(f"raw TCP sender failed: {_last(send.stderr)}")
        got = int(recv.stdout.readline() or -1)
        if recv.wait(timeout) != 0 or got != nbytes * files:
            raise RuntimeError(f"raw TCP receiver got {got} of {nbytes * files} bytes: "
                               f"{_last(recv.stderr.read())}")
        return float(json.loads(send.stdout)["seconds"])
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
        for f in (recv.stdout, recv.stderr):
            if f is not None:
                f.close()


def sync_stream_seconds(run_dir: str | os.PathLike) -> float:
    """Seconds the producer of a sync two-namespace run spent in its closes (the
    ``close_calls`` and ``closes`` times of its ``producer.json``): the stream of every
    file to the other host, each until that host sealed its copy."""
    with open(os.path.join(run_dir, "producer.json"), encoding="utf-8") as f:
        prod = json.load(f)
    return float(sum(end - start for start, end in
                     zip(prod["close_calls"], prod["closes"], strict=True)))


def _last(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else "no message"


def _receive(address: str, port: int) -> None:
    """Accept one stream, read it to its end into one buffer, acknowledge, print the count."""
    with socket.create_server((address, port), reuse_port=False) as srv:
        print("ready", flush=True)
        conn, _ = srv.accept()
        with conn:
            buf = bytearray(_BUF)
            total = 0
            while n := conn.recv_into(buf):
                total += n
            conn.sendall(b"k")
    print(total, flush=True)


def _send(address: str, port: int, nbytes: int, files: int) -> None:
    """Write the files into memory, then ``sendfile`` them all over one stream; print the
    seconds from the first ``sendfile`` to the receiver's acknowledgement."""
    data = os.urandom(min(nbytes, _BUF))
    fds = []
    for i in range(files):
        fd = os.memfd_create(f"tcp{i}", os.MFD_CLOEXEC)
        left = nbytes
        while left:
            left -= os.write(fd, data[:min(left, len(data))])
        fds.append(fd)
    with socket.create_connection((address, port), timeout=600.0) as s:
        s.settimeout(None)  # blocking: sendfile on a socket with a timeout gets EAGAIN
        t0 = time.monotonic()
        for fd in fds:
            off = 0
            while off < nbytes:
                off += os.sendfile(s.fileno(), fd, off, nbytes - off)
        s.shutdown(socket.SHUT_WR)
        if s.recv(1) != b"k":
            raise RuntimeError("the receiver did not acknowledge")
        seconds = time.monotonic() - t0
    print(json.dumps({"seconds": seconds}))


def main(argv: list[str]) -> int:
    """``receive ADDRESS PORT`` or ``send ADDRESS PORT NBYTES FILES``."""
    if argv[0] == "receive":
        _receive(argv[1], int(argv[2]))
    else:
        _send(argv[1], int(argv[2]), int(argv[3]), int(argv[4]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
