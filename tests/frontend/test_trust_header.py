"""The frontend sends each key's trust allowlist to the ingress as X-Otela-Trusted-Providers.

A recording stand-in ingress (named as such: a small aiohttp app that answers like the gateway) shows what goes over
the wire; test_mesh_usage checks the routing itself against the real gateway.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from frontend_helpers import start_frontend

from opentela.frontend import Frontend
from opentela.frontend.keys import KeySettings

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest_asyncio.fixture
async def frontend(recording_ingress: tuple[str, list], tmp_path: Path) -> AsyncIterator[Frontend]:
    fe = await start_frontend(recording_ingress[0], f"sqlite:///{tmp_path / 'f.db'}")
    try:
        yield fe
    finally:
        await fe.aclose()


@pytest.mark.parametrize(
    ("key_default", "client_header", "sent"),
    [
        (None, None, None),
        (["lab-a", "lab-b"], None, "lab-a,lab-b"),
        (["lab-a", "lab-b"], "lab-b, elsewhere", "lab-b"),
        (None, "lab-c", "lab-c"),
    ],
)
async def test_key_trust_allowlist_goes_to_the_ingress(
    frontend: Frontend, recording_ingress: tuple[str, list], key_default, client_header, sent
) -> None:
    _, secret = await frontend.state.keys.create(KeySettings(trusted_providers=key_default))
    headers = {"Authorization": f"Bearer {secret}"}
    if client_header:
        headers["X-Otela-Trusted-Providers"] = client_header
    async with aiohttp.ClientSession() as http:
        async with http.post(frontend.url + "/v1/chat/completions", json=CHAT, headers=headers) as r:
            assert r.status == 200
            request_id = r.headers["X-Otela-Request-Id"]
    (forwarded,) = recording_ingress[1]
    assert forwarded.get("x-otela-trusted-providers") == sent
    assert forwarded.get("x-request-id") == request_id  # one id from the client's view to the ingress
    assert "authorization" not in forwarded  # the user's key never leaves the frontend


async def test_a_client_cannot_widen_the_key_allowlist(frontend: Frontend, recording_ingress) -> None:
    _, secret = await frontend.state.keys.create(KeySettings(trusted_providers=("lab-a",)))
    headers = {"Authorization": f"Bearer {secret}", "X-Otela-Trusted-Providers": "lab-z"}
    async with aiohttp.ClientSession() as http:
        async with http.post(frontend.url + "/v1/chat/completions", json=CHAT, headers=headers) as r:
            assert r.status == 400 and "lab-a" in (await r.json())["error"]["message"]
    assert recording_ingress[1] == []


async def test_routing_headers_reach_the_ingress(frontend: Frontend, recording_ingress) -> None:
    """QoS constraints, a policy choice and the resume opt-out are the ingress's to judge: passed through as sent."""
    _, secret = await frontend.state.keys.create(KeySettings())
    sent = {"X-Otela-Require": "gpu=H100", "X-Otela-Policy": "least_loaded", "X-Otela-Resume": "off"}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            frontend.url + "/v1/chat/completions",
            json=CHAT,
            headers={"Authorization": f"Bearer {secret}", **sent},
        ) as r:
            assert r.status == 200
    (forwarded,) = recording_ingress[1]
    assert {k: forwarded.get(k.lower()) for k in sent} == sent
