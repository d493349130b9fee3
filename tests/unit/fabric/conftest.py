"""Fixtures for fabric tests: hosts on loopback with short timeouts, closed after each test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from fabric_helpers import FAST, HostFactory, echo

from opentela.fabric._config import FabricConfig
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity


@pytest.fixture
async def make_host() -> AsyncIterator[HostFactory]:
    """Create hosts (with an /echo handler) that are closed when the test ends."""
    hosts: list[Host] = []

    async def factory(listen: str = "127.0.0.1:0", config: FabricConfig = FAST, **kw: object) -> Host:
        host = await Host.create(Identity.generate(), listen, config=config)
        host.set_handler("/echo", echo)
        hosts.append(host)
        return host

    yield factory
    for host in hosts:
        await host.aclose()
