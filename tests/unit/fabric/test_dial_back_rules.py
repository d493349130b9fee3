"""Which addresses a dial-back may reach: only the asker's own, and only a few times a minute per peer."""

from __future__ import annotations

import asyncio

import pytest

from opentela.errors import PeerUnreachableError
from opentela.fabric._config import FabricConfig
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity
from opentela.fabric.relay import is_local_ip, owns_address


def test_only_the_askers_own_ip_or_for_a_local_asker_this_hosts_addresses() -> None:
    assert owns_address("203.0.113.7", "203.0.113.7")
    assert owns_address("::ffff:203.0.113.7", "203.0.113.7")  # the same address, IPv4-mapped
    assert not owns_address("203.0.113.8", "203.0.113.7")
    assert not owns_address("127.0.0.1", "203.0.113.7")  # a remote asker never gets our loopback
    assert owns_address("127.0.0.1", "127.0.0.1") and owns_address("127.0.0.5", "127.0.0.1")
    for other_host in ("169.254.169.254", "192.0.2.1", "10.255.255.254", "0.0.0.0", "224.0.0.1"):
        assert not owns_address(other_host, "127.0.0.1"), other_host
    assert not owns_address("not-an-ip", "127.0.0.1")
    assert is_local_ip("127.0.0.1") and not is_local_ip("192.0.2.1")


async def test_a_peer_gets_a_few_dial_backs_a_window_then_refusals() -> None:
    target = await Host.create(Identity.generate(), "127.0.0.1:0", config=FabricConfig(dial_back_limit=2))
    asker = await Host.create(Identity.generate(), "127.0.0.1:0")
    try:
        await asker.connect(target.listen_addrs[0])
        own = asker.listen_addrs[0]
        assert await asker.check_reachable(target.peer_id, [own, "192.0.2.1:80"]) == [own]
        assert await asker.check_reachable(target.peer_id, [own]) == [own]
        with pytest.raises(PeerUnreachableError, match="too many dial-back requests"):
            await asker.check_reachable(target.peer_id, [own])
        stats = target.relay.stats()
        assert (
            stats["dial_backs"] == 2
            and stats["dial_back_refused"] == 1
            and stats["dial_back_rate_limited"] == 1
        )
    finally:
        await asyncio.gather(asker.aclose(), target.aclose())
