"""Peer address strings: "host:port", "[v6]:port", "<peerid>@host:port" and "/ip4/../tcp/../p2p/<peerid>"."""

from __future__ import annotations

import ipaddress

from opentela._types import PeerId
from opentela.fabric.identity import is_peer_id

_HOST_FORBIDDEN = set(" /@[]\t\r\n")


def _port(text: str, addr: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise ValueError(f"bad port {text!r} in address {addr!r}")
    return int(text)


def _peer(text: str, addr: str) -> PeerId:
    if not is_peer_id(text):
        raise ValueError(f"bad peer id {text!r} in address {addr!r}")
    return text


def _parse_multiaddr(addr: str) -> tuple[str, int, PeerId | None]:
    parts = addr.split("/")[1:]
    if len(parts) not in (4, 6) or parts[2] != "tcp" or (len(parts) == 6 and parts[4] != "p2p"):
        raise ValueError(f"expected /ip4|ip6|dns/HOST/tcp/PORT[/p2p/PEERID], got {addr!r}")
    kind, host = parts[0], parts[1]
    try:
        if kind == "ip4":
            host = str(ipaddress.IPv4Address(host))
        elif kind == "ip6":
            host = str(ipaddress.IPv6Address(host))
        elif kind in ("dns", "dns4", "dns6"):
            if not host or _HOST_FORBIDDEN & set(host):
                raise ValueError(host)
        else:
            raise ValueError(kind)
    except ValueError:
        raise ValueError(f"bad /{kind}/ component {host!r} in address {addr!r}") from None
    return host, _port(parts[3], addr), _peer(parts[5], addr) if len(parts) == 6 else None


def parse_addr(addr: str) -> tuple[str, int, PeerId | None]:
    """Split a peer address into (host, port, peer id or None); ValueError names what is wrong.

    IPv6 hosts come back without brackets; port 0 is accepted (a listen address asking for any free port).
    """
    addr = addr.strip()
    if addr.startswith("/"):
        return _parse_multiaddr(addr)
    peer_id: PeerId | None = None
    if "@" in addr:
        pid, _, addr_part = addr.partition("@")
        peer_id = _peer(pid, addr)
    else:
        addr_part = addr
    if addr_part.startswith("["):
        host, sep, rest = addr_part[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"expected [IPV6]:PORT, got {addr!r}")
        try:
            host = str(ipaddress.IPv6Address(host))
        except ValueError:
            raise ValueError(f"bad IPv6 address {host!r} in {addr!r}") from None
        return host, _port(rest[1:], addr), peer_id
    host, sep, port = addr_part.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {addr!r}")
    if ":" in host:
        raise ValueError(f"an IPv6 address needs brackets, as in [::1]:4001; got {addr!r}")
    if _HOST_FORBIDDEN & set(host):
        raise ValueError(f"bad host {host!r} in address {addr!r}")
    return host, _port(port, addr), peer_id


def format_addr(host: str, port: int, peer_id: PeerId | None = None, *, multiaddr: bool = False) -> str:
    """The inverse of parse_addr: "host:port", "[v6]:port", "peer@host:port" or the /ip4/... form."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if multiaddr:
        kind = "dns" if ip is None else f"ip{ip.version}"
        return f"/{kind}/{host}/tcp/{port}" + (f"/p2p/{peer_id}" if peer_id else "")
    hostport = f"[{host}]:{port}" if ip is not None and ip.version == 6 else f"{host}:{port}"
    return f"{peer_id}@{hostport}" if peer_id else hostport
