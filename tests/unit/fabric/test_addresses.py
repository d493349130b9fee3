"""Peer address parsing and formatting in every accepted notation."""

from __future__ import annotations

import pytest

from opentela.fabric.addresses import format_addr, parse_addr
from opentela.fabric.identity import Identity

PEER = Identity.generate().peer_id


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:4001", ("127.0.0.1", 4001, None)),
        ("node-7.cluster.local:80", ("node-7.cluster.local", 80, None)),
        ("0.0.0.0:0", ("0.0.0.0", 0, None)),
        ("[::1]:4001", ("::1", 4001, None)),
        ("[2001:db8::1]:9", ("2001:db8::1", 9, None)),
        (f"{PEER}@10.0.0.2:4001", ("10.0.0.2", 4001, PEER)),
        (f"{PEER}@[::1]:4001", ("::1", 4001, PEER)),
        ("/ip4/1.2.3.4/tcp/4001", ("1.2.3.4", 4001, None)),
        (f"/ip4/1.2.3.4/tcp/4001/p2p/{PEER}", ("1.2.3.4", 4001, PEER)),
        (f"/ip6/::1/tcp/5/p2p/{PEER}", ("::1", 5, PEER)),
        ("/dns/boot.example.org/tcp/443", ("boot.example.org", 443, None)),
        ("/dns4/boot.example.org/tcp/443", ("boot.example.org", 443, None)),
        ("  127.0.0.1:1  ", ("127.0.0.1", 1, None)),
    ],
)
def test_parse(text: str, expected: tuple[str, int, str | None]) -> None:
    assert parse_addr(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "localhost",
        ":4001",
        "host:",
        "host:70000",
        "host:-1",
        "host:http",
        "::1:4001",
        "[::1]4001",
        "[nonsense]:1",
        "notapeer@host:1",
        "/ip4/1.2.3/tcp/1",
        "/ip4/1.2.3.4/udp/1",
        "/ip4/1.2.3.4/tcp/1/p2p/xyz",
        "/ip5/1.2.3.4/tcp/1",
        "/ip4/1.2.3.4/tcp",
        "a b:1",
    ],
)
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_addr(text)


@pytest.mark.parametrize(
    ("args", "kw", "text"),
    [
        (("127.0.0.1", 1), {}, "127.0.0.1:1"),
        (("::1", 2), {}, "[::1]:2"),
        (("h.example", 3, PEER), {}, f"{PEER}@h.example:3"),
        (("1.2.3.4", 4, PEER), {"multiaddr": True}, f"/ip4/1.2.3.4/tcp/4/p2p/{PEER}"),
        (("::1", 5), {"multiaddr": True}, "/ip6/::1/tcp/5"),
        (("h.example", 6), {"multiaddr": True}, "/dns/h.example/tcp/6"),
    ],
)
def test_format_round_trips(args: tuple, kw: dict, text: str) -> None:
    assert format_addr(*args, **kw) == text
    host, port, *rest = args
    assert parse_addr(text) == (host, port, rest[0] if rest else None)
