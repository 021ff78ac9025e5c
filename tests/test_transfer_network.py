"""Cross-host pieces without namespaces: the ``hosts`` config, routing by pattern, the
rules' route lines, the secret file, the HMAC handshake and range merging."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from ensio.config.errors import ConfigError
from ensio.transfer.config import load_transfer_config, transfer_from_dict
from ensio.transfer.errors import TransferError
from ensio.transfer.hosts import consumer_hosts
from ensio.transfer.outgoing import merge
from ensio.transfer.run import rules_text
from ensio.transfer.secret import ensure_secret, read_secret
from ensio.transfer.wire import WIRE_VERSION, AuthError, client_handshake, server_handshake


def raw(hosts=None, **conn):
    c = {"name": "restarts", "from": "model", "to": "post", "files": ["/x/mem*.nc"], **conn}
    out = {"components": ["model", "post"], "connections": [c]}
    if hosts is not None:
        out["hosts"] = hosts
    return out


AB = {"a": {"address": "10.0.0.1", "components": ["model"]},
      "b": {"address": "10.0.0.2", "port": 7000, "components": ["post"]}}


@pytest.mark.parametrize("hosts, msg", [
    ({}, "hosts: expected a non-empty mapping"),
    ({"a": {"components": ["model"]}}, "hosts.a.address: required config key is missing"),
    ({"a": {"address": "0.0.0.0"}}, "hosts.a.address: 0.0.0.0 would listen on every interface"),
    ({"a": {"address": "::"}}, "hosts.a.address: :: would listen on every interface"),
    ({"a": {"address": "node1"}}, "hosts.a.address: 'node1' is not an IP address"),
    ({"a": {"address": "10.0.0.1", "port": 70000}}, "hosts.a.port: 70000 is not a TCP port"),
    ({"a": {"address": "10.0.0.1", "components": ["modle"]}},
     "hosts.a.components[0]: 'modle' is not a component (model, post)"),
    ({"a": {"address": "10.0.0.1", "colour": 1}}, "hosts.a.colour: unknown config key"),
    ({"a,b": {"address": "10.0.0.1"}}, "hosts.a,b: 'a,b' is not a simple host name"),
])
def test_hosts_errors_name_the_key(hosts, msg):
    with pytest.raises(ConfigError) as info:
        transfer_from_dict(raw(hosts))
    assert str(info.value).startswith(msg) and "\n" not in str(info.value)


def test_the_secret_defaults_to_a_file_next_to_the_config(tmp_path):
    import yaml

    t = tmp_path / "t.yaml"
    t.write_text(yaml.safe_dump(raw(AB)))
    assert load_transfer_config(t).secret == tmp_path / "t.yaml.secret"
    t.write_text(yaml.safe_dump({**raw(AB), "secret": "keys/exp.key"}))
    assert load_transfer_config(t).secret == tmp_path / "keys" / "exp.key"


def _hosts(placement):
    return transfer_from_dict(raw({h: {"address": f"10.0.0.{i + 1}", "components": c}
                                   for i, (h, c) in enumerate(placement.items())})).hosts


@pytest.mark.parametrize("pattern, rank, want", [
    ("1-1", 0, ("b",)), ("1-1", 1, ("c",)), ("1-1", 2, ("b",)),  # post processes: b, c
    ("1-N", 0, ("b", "c")), ("all-to-all", 5, ("b", "c")),
    ("N-1", 0, ("b",)), ("N-1", 7, ("b",)),
])
def test_consumer_hosts_follow_the_pattern(pattern, rank, want):
    hosts = _hosts({"a": ["model"], "b": ["post"], "c": ["post", "model"]})
    assert consumer_hosts(hosts, pattern, ("post",), rank) == want


def test_rules_route_lines_name_mode_and_hosts():
    c = transfer_from_dict(raw(AB, mode="async"))
    model = rules_text(c, "model", rank=0).splitlines()
    assert model[-1] == "route local:restarts A b"
    post = rules_text(c, "post").splitlines()
    assert not any(line.startswith("route") for line in post)  # consumers stream nothing
    single = transfer_from_dict(raw())
    assert not any(x.startswith("route") for x in rules_text(single, "model").splitlines())


def test_secret_is_created_0600_and_refused_when_others_may_read_it(tmp_path):
    path = ensure_secret(tmp_path / "s")
    assert path.stat().st_mode & 0o777 == 0o600
    first = read_secret(path)
    assert ensure_secret(path) == path and read_secret(path) == first  # kept
    assert len(first) == 64 and int(first, 16) >= 0
    path.chmod(0o604)
    with pytest.raises(TransferError, match="mode 0604, must be 0600"):
        read_secret(path)
    with pytest.raises(TransferError, match="cannot read it"):
        read_secret(tmp_path / "absent")


def _handshake(client_secret: bytes, server_secret: bytes):
    """Run both sides over a socketpair; (client outcome, server outcome)."""
    cs, ss = socket.socketpair()
    out = {}

    def server():
        try:
            out["server"] = server_handshake(ss, lambda ident: server_secret
                                             if ident == "exp1" else None)
        except AuthError as exc:
            out["server"] = exc.strerror
        finally:
            ss.close()

    t = threading.Thread(target=server)
    t.start()
    try:
        client_handshake(cs, client_secret, "exp1", "hostA")
        out["client"] = "ok"
    except AuthError as exc:
        out["client"] = exc.strerror
    cs.close()
    t.join(10)
    return out["client"], out["server"]


def test_handshake_accepts_the_secret_and_refuses_another():
    s = os.urandom(32)
    assert _handshake(s, s) == ("ok", ("exp1", "hostA"))
    client, server = _handshake(os.urandom(32), s)
    assert client == "the server does not know the experiment's secret"
    assert server.startswith("host hostA: left during the handshake")


def test_handshake_refuses_a_client_proof_made_with_another_secret():
    """A client that ignores the server's proof and answers with a guess is refused."""
    from ensio.transfer.secret import proof
    from ensio.transfer.wire import recv_frame, send_frame

    cs, ss = socket.socketpair()
    got = {}

    def server():
        with pytest.raises(AuthError) as info:
            server_handshake(ss, lambda ident: b"s" * 32)
        got["why"] = info.value.strerror
        ss.close()

    t = threading.Thread(target=server)
    t.start()
    send_frame(cs, "HELLO", proto=WIRE_VERSION, identity="exp1", host="rogue", nonce="0" * 32)
    challenge = recv_frame(cs)
    assert challenge is not None and challenge.verb == "CHALLENGE"
    send_frame(cs, "AUTH", mac=proof(b"t" * 32, "client", challenge.get("nonce"), "0" * 32,
                                      "exp1", "rogue"))
    assert recv_frame(cs) is None  # closed, no OK
    t.join(10)
    assert got["why"] == "host rogue: wrong secret for experiment exp1"


def test_merge_covers_the_same_bytes_as_the_union(rng):
    ranges = [(int(rng.integers(0, 1000)), int(rng.integers(0, 50))) for _ in range(200)]
    union = set()
    for off, n in ranges:
        union.update(range(off, off + n))
    merged = merge(ranges)
    covered = [b for off, n in merged for b in range(off, off + n)]
    assert sorted(covered) == sorted(union) and len(covered) == len(union)
    assert all(a[0] + a[1] < b[0] for a, b in zip(merged, merged[1:], strict=False))


@pytest.mark.parametrize("way", ["splice", "copy"])
def test_received_bytes_land_at_their_offset_and_no_further(way, rng):
    """The receiving side of a stream moves exactly ``n`` bytes from the socket into the
    memory file at ``off`` (by splice, or recv_into + pwrite): the bytes behind them on the
    socket (the next frame) stay there."""
    from ensio.transfer.sink import Sink

    head, body, tail = rng.bytes(1000), rng.bytes(3 * (1 << 20) + 77), b"NEXT FRAME"
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.memfd_create("t", os.MFD_CLOEXEC)
    os.write(fd, head)
    sender = threading.Thread(target=a.sendall, args=(body + tail,))
    sender.start()
    sink = Sink(b, fd)
    try:
        if way == "copy":
            sink.close()
        else:
            assert sink.pipe is not None
        assert sink.receive(len(head), len(body))
        if way == "splice":
            assert sink.pipe is not None  # the kernel took it: no fallback happened
        sender.join()
        assert b.recv(100) == tail
        assert os.pread(fd, len(head) + len(body) + 1, 0) == head + body
        a.close()
        assert not sink.receive(0, 10)  # the connection closed before the bytes came
    finally:
        sink.close()
        os.close(fd)
        a.close()
        b.close()
