"""Replicas reconfiguring: no new work while another replica serves the model, all of it when none does, streams
under way left alone, and their state, TP degree and healthy ranks in /v1/models."""

from __future__ import annotations

import asyncio
import dataclasses

from meshkit import MODEL, chat, gateway_kit, record

from opentela.engines.simulated import SimulatedConfig
from opentela.gateway.routing import prefer_serving
from opentela.registry.record import ModelEntry

RECONFIGURING = {"replica_state": "reconfiguring", "tp_degree": 2, "tp_ranks": "0,2"}
SERVING = {"replica_state": "serving", "tp_degree": 3, "tp_ranks": "0,1,2"}


def test_a_reconfiguring_replica_is_left_out_while_another_serves() -> None:
    a, b, c = record("a", settings=RECONFIGURING), record("b", settings=SERVING), record("c")
    assert prefer_serving([a, b, c], MODEL) == [b, c]  # c says nothing about its state: it serves
    assert prefer_serving([a], MODEL) == [a]  # alone, it still takes the request (its engine queues it)
    both = [a, record("d", settings=RECONFIGURING)]
    assert prefer_serving(both, MODEL) == both
    assert prefer_serving([], MODEL) == []


def test_the_state_is_read_from_the_requested_models_entry() -> None:
    two = dataclasses.replace(
        record("a", settings=RECONFIGURING),
        models=(ModelEntry(MODEL, "tp", RECONFIGURING), ModelEntry("other", "tp", SERVING)),
    )
    b = record("b", model="other", settings=RECONFIGURING)
    assert prefer_serving([two, b], "other") == [two]
    assert prefer_serving([two, record("c")], MODEL)[0].session_id == "s-c"
    # Any state but serving counts as not serving (the tensor-parallel engine also says `starting`).
    starting, plain = record("e", settings={"replica_state": "starting"}), record("f")
    assert prefer_serving([starting, plain], MODEL) == [plain]


async def test_new_work_goes_to_the_serving_replica_and_to_a_lone_reconfiguring_one() -> None:
    async with gateway_kit(policy="round_robin") as kit:
        await kit.replica("a", settings=RECONFIGURING)
        await kit.replica("b", settings=SERVING)
        for _ in range(6):
            status, headers, _ = await kit.post(chat())
            assert (status, headers["X-Otela-Session"]) == (200, "s-b")
        assert kit.requests_seen("a") == 0
        # Only `a` is trusted for this request: it is the one replica left, so it gets the request.
        status, headers, _ = await kit.post(chat(), {"X-Otela-Trusted-Providers": "a"})
        assert (status, headers["X-Otela-Session"]) == (200, "s-a")


async def test_a_failed_serving_replica_retries_on_the_reconfiguring_one() -> None:
    async with gateway_kit(policy="round_robin") as kit:
        await kit.replica("a", settings=RECONFIGURING)
        await kit.replica(
            "b", SimulatedConfig(model=MODEL, ttft_ms=1, itl_ms=0, error_rate=1.0), settings=SERVING
        )
        status, headers, _ = await kit.post(chat())
        assert (status, headers["X-Otela-Session"]) == (200, "s-a")
        assert kit.requests_seen("b") == 1


async def test_a_stream_under_way_is_untouched_when_its_replica_starts_reconfiguring() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a", SimulatedConfig(model=MODEL, ttft_ms=1, itl_ms=40), settings=SERVING)
        assert kit.http is not None
        async with kit.http.post(
            kit.url + "/v1/chat/completions", json=chat(max_tokens=15, stream=True)
        ) as resp:
            assert resp.headers["X-Otela-Session"] == "s-a"
            first = await resp.content.readuntil(b"\n\n")
            # The registry now says `a` reconfigures: the stream already relayed from it must run to its end.
            kit.mesh.records["s-a"] = dataclasses.replace(
                kit.mesh.records["s-a"], models=(ModelEntry(MODEL, "simulated", RECONFIGURING),)
            )
            rest = await asyncio.wait_for(resp.content.read(), 30)
        events = [e for e in (first + rest).split(b"\n\n") if e.startswith(b"data: ")]
        assert events[-1] == b"data: [DONE]" and b'"error"' not in rest
        assert len(events) >= 15


async def test_models_show_each_replicas_state_and_tensor_parallel_ranks() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a", settings=RECONFIGURING)
        await kit.replica("b", settings={**SERVING, "tp_ranks": "0,x"})
        await kit.replica("c")
        assert kit.http is not None
        async with kit.http.get(kit.url + "/v1/models") as resp:
            listing = await resp.json()
        replicas = {r["session_id"]: r for r in listing["data"][0]["replicas"]}
        a, b, c = replicas["s-a"], replicas["s-b"], replicas["s-c"]
        assert (a["state"], a["replica_state"], a["tp_degree"], a["tp_ranks"]) == (
            "SERVING",
            "reconfiguring",
            2,
            [0, 2],
        )
        assert a["settings"]["tp_ranks"] == "0,2"
        assert (b["replica_state"], b["tp_degree"]) == (
            "serving",
            3,
        ) and "tp_ranks" not in b  # malformed: left out
        assert c["replica_state"] == "serving" and "tp_degree" not in c and "tp_ranks" not in c
