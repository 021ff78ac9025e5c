"""Daemon-to-daemon TCP: framing and the authenticating handshake.

Frames are a 4-byte big-endian length and a packet of :mod:`.protocol`'s text form
(verb, ``key=value`` lines). File bytes follow a ``DATA off= len=`` frame raw, exactly
``len`` of them. A TCP connection carries one file at a time, from the producer host's
daemon (the client) to a consumer host's daemon (the server); once ``DONE`` is answered
``OK`` the client may send the next ``FILE`` on it (:mod:`.kept`)::

    client: HELLO proto= identity= host= nonce=NC
    server: CHALLENGE nonce=NS mac=proof(secret, "server", NC, NS, identity)
    client: AUTH mac=proof(secret, "client", NS, NC, identity, host)
    server: OK                                   (or it logs the refusal and closes)
    client: FILE path= conn= component= mode= size=
    server: OK | ERR errno=
    client: DATA off= len= <len bytes> ...       (no replies: TCP is the flow control)
    client: SIZE size= r=OFF+LEN,...             (the producer closed: the final size and
                                                 the ranges still to come, in order)
    client: DATA off= len= <len bytes> ...       (exactly those ranges)
    client: DONE size=
    server: OK | ERR errno=                      (the file is sealed on the consumer host)

Pull on demand (all-to-all): the consumer host's daemon connects and, after the
handshake, sends ``PULL path= conn= wait_ms=``; the other answers ``ABSENT`` (or
``ERR``) or streams the file back as above, ``FILE`` first, once it is complete.

``SIZE`` lets the consumer host serve the bytes already final before ``DONE``
(``serve_partial``, :mod:`.progress`). Async sends ``DATA`` before ``SIZE`` too (ranges
written while the producer runs); sync only after it.

Unlink, rename and producer runs (:mod:`.names`): a daemon keeps one connection per
other host whose first frame is ``CONTROL`` (answered ``OK``); either side may open
one, then::

    client: UNLINK path= [producer=1 conns=C,...]  |  RENAME old= new= [producer=1 conns=C,...]
    server: OK                                   (applied on the other host)
    client: RUNS instance= version= conns=NAME+LIVE+ENDED,...   (a push: no answer)
    client: RUNS ask=1 path= instance= version= conns=...
    server: OK instance= version= conns= held=0|1
    client: BYE                                  (daemon exit: the copies are dropped)
    client: GIVEUP                               (the sender gave up on this host)

It ending without ``BYE`` or ``GIVEUP`` (the sending daemon died) marks the copies from
that host still arriving lost on the other host; complete ones stay served.
A ``FILE`` is refused (``ERR errno=ENOTCONN``) unless the sender's control connection is
open.

The connection closing before ``DONE`` fails the file on the consumer host (EIO for
its consumers). Keepalive and ``TCP_USER_TIMEOUT`` turn a vanished host into a
closed connection within about a minute instead of a hang.
"""

from __future__ import annotations

import errno
import secrets
import socket
import struct
import time

from .protocol import MAX_PACKET, Message, decode, encode
from .secret import proof, verify

__all__ = ["AuthError", "CONNECT_S", "HANDSHAKE_S", "client_handshake", "connect_to", "listen_on",
           "parse_endpoint", "recv_exact_into", "recv_frame", "send_frame", "server_handshake",
           "tune"]

WIRE_VERSION = 4  # 2: the SIZE frame (serve_partial); 3: CONTROL (names.py); 4: RUNS
_LEN = struct.Struct("!I")


class AuthError(OSError):
    """The other side does not know the experiment's secret (or speaks another protocol)."""


def tune(sock: socket.socket) -> None:
    """Keepalive, a bounded wait for unacknowledged data, no Nagle delay."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, val in (("TCP_KEEPIDLE", 20), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 4),
                     ("TCP_USER_TIMEOUT", 60_000), ("TCP_NODELAY", 1)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)


def send_frame(sock: socket.socket, verb: str, **fields: object) -> None:
    data = encode(verb, **fields)
    sock.sendall(_LEN.pack(len(data)) + data)


def recv_exact_into(sock: socket.socket, view: memoryview) -> bool:
    """Fill ``view`` from ``sock``; False if the connection closed first."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


def recv_frame(sock: socket.socket) -> Message | None:
    """One frame, or None when the connection closed (or sent garbage)."""
    head = bytearray(_LEN.size)
    if not recv_exact_into(sock, memoryview(head)):
        return None
    (n,) = _LEN.unpack(head)
    if n > MAX_PACKET:
        return None
    body = bytearray(n)
    if not recv_exact_into(sock, memoryview(body)):
        return None
    return decode(bytes(body))


def client_handshake(sock: socket.socket, secret: bytes, identity: str, host: str) -> None:
    """Prove the secret to the server and check the server's proof.

    Raises
    ------
    AuthError
        The server refused us, or could not prove the secret itself.
    """
    nc = secrets.token_hex(16)
    send_frame(sock, "HELLO", proto=WIRE_VERSION, identity=identity, host=host, nonce=nc)
    m = recv_frame(sock)
    if m is None or m.verb != "CHALLENGE":
        raise AuthError(errno.EACCES, f"refused: {m.get('why') if m else 'connection closed'}")
    ns = m.get("nonce")
    if len(ns) < 32 or not verify(secret, m.get("mac"), "server", nc, ns, identity):
        raise AuthError(errno.EACCES, "the server does not know the experiment's secret")
    send_frame(sock, "AUTH", mac=proof(secret, "client", ns, nc, identity, host))
    m = recv_frame(sock)
    if m is None or m.verb != "OK":
        raise AuthError(errno.EACCES, "the server refused our proof of the secret "
                                      "(different secret files?)")


def server_handshake(sock: socket.socket, secrets_by_identity) -> tuple[str, str]:
    """Check the client's proof; (identity, host) of an authenticated client.

    ``secrets_by_identity(identity)`` returns the secret's bytes, or None for an
    experiment this daemon does not serve.

    Raises
    ------
    AuthError
        With the reason, for the daemon's log.
    """
    m = recv_frame(sock)
    if m is None or m.verb != "HELLO" or m.int("proto", -1) != WIRE_VERSION:
        raise AuthError(errno.EPROTO, "not an ensio transfer peer (bad HELLO)")
    identity, host, nc = m.get("identity"), m.get("host", "?"), m.get("nonce")
    secret = secrets_by_identity(identity)
    if secret is None:
        send_frame(sock, "ERR", why=f"unknown experiment {identity}")
        raise AuthError(errno.EACCES, f"host {host}: unknown experiment {identity}")
    if len(nc) < 32:
        raise AuthError(errno.EPROTO, f"host {host}: short nonce")
    ns = secrets.token_hex(16)
    send_frame(sock, "CHALLENGE", nonce=ns, mac=proof(secret, "server", nc, ns, identity))
    m = recv_frame(sock)
    if m is None:  # the client found our proof wrong: a different secret file
        raise AuthError(errno.EACCES, f"host {host}: left during the handshake (does it use "
                                      f"another secret for experiment {identity}?)")
    if m.verb != "AUTH" or not verify(secret, m.get("mac"), "client", ns, nc, identity, host):
        raise AuthError(errno.EACCES, f"host {host}: wrong secret for experiment {identity}")
    send_frame(sock, "OK")
    return identity, host


#: How long a producer's daemon retries a host that is not up yet; the handshake's limit.
CONNECT_S = 5.0
HANDSHAKE_S = 15.0


def parse_endpoint(text: str) -> tuple[str, int]:
    """``addr:port`` or ``[v6]:port`` → (addr, port)."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def listen_on(endpoint: str) -> socket.socket:
    """A listening TCP socket on ``addr:port`` (IPv4 or ``[v6]``)."""
    addr, port = parse_endpoint(endpoint)
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((addr, port))
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    return sock


def connect_to(endpoint: str, patience: float = CONNECT_S) -> socket.socket:
    """Connect, retrying while the other host's daemon is not listening yet."""
    addr, port = parse_endpoint(endpoint)
    deadline = time.monotonic() + patience
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=HANDSHAKE_S)
        except (TimeoutError, ConnectionRefusedError) as exc:
            if time.monotonic() > deadline:
                raise OSError(exc.errno or errno.ECONNREFUSED,
                              f"no daemon listens there ({exc})") from None
            time.sleep(0.1)  # the other daemon starts independently: retry until the deadline
            continue
        tune(sock)
        return sock
