"""A request for a serverless model with no replica is held while a controller starts one, within bounds."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from meshkit import MODEL, chat, gateway_kit


async def test_without_a_controller_an_unknown_model_is_404_at_once() -> None:
    async with gateway_kit() as kit:
        status, _, body = await kit.post(chat())
        assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"


async def test_a_model_no_controller_knows_is_404() -> None:
    async with gateway_kit() as kit:

        async def unknown(model: str) -> dict[str, Any]:
            return {"ok": False, "code": "unknown_model", "error": "no"}

        kit.mesh.demand = unknown
        status, _, body = await kit.post(chat())
        assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
        assert kit.mesh.wants == [MODEL]


async def test_a_held_request_is_answered_once_the_replica_serves() -> None:
    async with gateway_kit() as kit:

        async def starting(model: str) -> dict[str, Any]:
            return {"ok": True, "state": "starting", "node": "p-x", "waited_s": 0.0}

        kit.mesh.demand = starting

        async def cold_start() -> None:
            await asyncio.sleep(0.4)
            await kit.replica("a")

        started = time.monotonic()
        (status, _, body), _ = await asyncio.gather(kit.post(chat()), cold_start())
        assert status == 200, body
        assert time.monotonic() - started >= 0.4
        assert kit.mesh.wants == [MODEL] and kit.gateway.state.hold.held == 0
        assert kit.gateway.state.hold.cold_starts[MODEL] >= 0.4


async def test_a_start_that_never_comes_ends_in_503_with_retry_after() -> None:
    async with gateway_kit(cold_start_timeout=0.5) as kit:

        async def starting(model: str) -> dict[str, Any]:
            return {"ok": True, "state": "starting"}

        kit.mesh.demand = starting
        started = time.monotonic()
        status, headers, body = await kit.post(chat())
        assert status == 503 and json.loads(body)["error"]["code"] == "cold_start_failed"
        assert int(headers["Retry-After"]) >= 1 and 0.5 <= time.monotonic() - started < 5


async def test_no_room_and_a_full_queue_answer_503_at_once() -> None:
    async with gateway_kit(cold_start_timeout=1.0, cold_start_queue=1) as kit:

        async def no_room(model: str) -> dict[str, Any]:
            return {"ok": False, "code": "no_room", "error": "no node has 600 MiB free"}

        kit.mesh.demand = no_room
        status, _, body = await kit.post(chat())
        assert status == 503 and "600 MiB" in json.loads(body)["error"]["message"]

        async def starting(model: str) -> dict[str, Any]:
            return {"ok": True, "state": "starting"}

        kit.mesh.demand = starting
        first = asyncio.create_task(kit.post(chat()))
        await asyncio.sleep(0.2)
        started = time.monotonic()
        status, _, body = await kit.post(chat())
        assert status == 503 and "already wait" in json.loads(body)["error"]["message"]
        assert time.monotonic() - started < 0.5
        assert (await first)[0] == 503


async def test_replicas_all_full_make_the_gateway_ask_for_one_more_instance() -> None:
    async with gateway_kit(policy="slo_headroom") as kit:

        async def warm(model: str) -> dict[str, Any]:
            return {"ok": True, "state": "starting"}

        kit.mesh.demand = warm
        await kit.replica("a")  # no profile: nothing validates, so the policy asks for more and serves anyway
        statuses = [(await kit.post(chat()))[0] for _ in range(3)]
        assert statuses == [200, 200, 200]
        for _ in range(100):
            if kit.mesh.more:
                break
            await asyncio.sleep(0.02)
        assert kit.mesh.more == [MODEL]  # once, however many requests found it full


async def test_the_frontends_in_process_ingress_holds_for_a_cold_start_too() -> None:
    from opentela.frontend.ingress import IngressClient
    from opentela.frontend.ingress_inprocess import InProcessIngress, WholeAnswer

    async with gateway_kit() as kit:

        async def starting(model: str) -> dict[str, Any]:
            return {"ok": True, "state": "starting"}

        kit.mesh.demand = starting
        ingress = InProcessIngress(kit.gateway.state, IngressClient(kit.url))

        async def cold_start() -> None:
            await asyncio.sleep(0.3)
            await kit.replica("a")

        try:
            body = json.dumps(chat()).encode()
            answer, _ = await asyncio.gather(ingress.post("/v1/chat/completions", body, {}), cold_start())
            assert isinstance(answer, WholeAnswer) and answer.status == 200, answer
            assert json.loads(await answer.read())["choices"]
            assert kit.mesh.wants == [MODEL]
        finally:
            await ingress.aclose()
