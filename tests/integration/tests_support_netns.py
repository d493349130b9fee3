"""Private test hosts: Linux network namespaces joined by veth links, created and removed by the tests."""

from __future__ import annotations

import functools
import os
import subprocess
import uuid
from collections.abc import Sequence

import pytest

from system_tools import Unavailable, ensure_tool, find_tool, tool_env


@functools.cache
def ip_tool() -> str:
    """Full path of iproute2's `ip` (PATH, then the sbin folders); skip the test when it is not installed."""
    found = find_tool("ip")
    if found is None:
        pytest.skip("iproute2 (`ip`) is not installed (searched PATH and the sbin folders)")
    return found


def _ip(*args: str, ns: str | None = None) -> None:
    ip = ip_tool()
    argv = [ip, *(["netns", "exec", ns, ip] if ns else []), *args]
    subprocess.run(argv, check=True, capture_output=True, env=tool_env(), timeout=10)


def require_netns() -> None:
    """Skip (with the reason) where namespaces cannot be made: not root, or no iproute2."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    ip_tool()
    probe = f"otp{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"cannot create network namespaces here: {exc}")


class Namespaces:
    """A set of namespaces and links; everything is deleted on close."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:5]
        self.names: list[str] = []
        self.root_links: list[str] = []

    def add(self, short: str) -> str:
        """A new namespace with loopback up."""
        name = f"ot{self.tag}{short}"
        _ip("netns", "add", name)
        self.names.append(name)
        _ip("link", "set", "lo", "up", ns=name)
        return name

    def link(self, a: str, a_ip: str, b: str | None, b_ip: str) -> tuple[str, str]:
        """A veth pair between namespace a and namespace b (None: the root namespace), /24 addresses."""
        ia, ib = f"v{self.tag}{len(self.root_links)}a", f"v{self.tag}{len(self.root_links)}b"
        self.root_links.append(ia)
        _ip("link", "add", ia, "type", "veth", "peer", "name", ib)
        _ip("link", "set", ia, "netns", a)
        if b is not None:
            _ip("link", "set", ib, "netns", b)
        _ip("addr", "add", f"{a_ip}/24", "dev", ia, ns=a)
        _ip("link", "set", ia, "up", ns=a)
        _ip("addr", "add", f"{b_ip}/24", "dev", ib, ns=b)
        _ip("link", "set", ib, "up", ns=b)
        return ia, ib

    def set_link(self, ns: str, dev: str, up: bool) -> None:
        """Bring a link up or down inside `ns` (down on either end cuts the pair)."""
        _ip("link", "set", dev, "up" if up else "down", ns=ns)

    def close(self) -> None:
        """Delete every namespace (their links go with them) and stray root-side links."""
        for name in self.names:
            subprocess.run([ip_tool(), "netns", "del", name], capture_output=True, timeout=10, check=False)
        for link in self.root_links:
            subprocess.run(
                [ip_tool(), "link", "del", f"{link[:-1]}b"], capture_output=True, timeout=10, check=False
            )


def in_ns(ns: str, argv: Sequence[str]) -> list[str]:
    """Run `argv` inside namespace `ns` (`ip netns exec` looks its command up in the caller's PATH)."""
    return [ip_tool(), "netns", "exec", ns, *argv]


def ensure_nft() -> str:
    """The nft binary, installed from Debian's packages when missing; skip with the reason if that fails."""
    try:
        return ensure_tool("nft", "nftables")
    except Unavailable as exc:
        pytest.skip(f"nftables cannot run here: {exc}")


def drop_inbound_connections(ns: str) -> None:
    """Firewall `ns` the way a cluster's compute nodes are: outbound connections only, new inbound ones dropped."""
    nft = ensure_nft()
    run = lambda *a: subprocess.run(in_ns(ns, [nft, *a]), check=True, capture_output=True, env=tool_env())  # noqa: E731
    run("add", "table", "inet", "otela_test")
    run("add", "chain", "inet", "otela_test", "in", "{ type filter hook input priority 0 ; policy accept ; }")
    run(
        "add",
        "rule",
        "inet",
        "otela_test",
        "in",
        "iifname",
        "!=",
        "lo",
        "tcp",
        "flags",
        "& (syn|ack) == syn",
        "drop",
    )
