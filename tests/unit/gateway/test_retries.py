"""Retries, cooldown and timeouts of the gateway, against real simulated engines behind the real proxy."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from meshkit import MODEL, chat, gateway_kit, record

from opentela.engines.simulated import SimulatedConfig


def failing(**kw: object) -> SimulatedConfig:
    return SimulatedConfig(model=MODEL, ttft_ms=1, itl_ms=0, error_rate=1.0, **kw)


async def test_engine_5xx_is_retried_on_another_replica() -> None:
    async with gateway_kit(policy="round_robin") as kit:
        await kit.replica("a", failing())
        await kit.replica("b")
        for _ in range(6):
            status, headers, _ = await kit.post(chat())
            assert status == 200
            assert headers["X-Otela-Session"] == "s-b"
        # round robin sent some first attempts to `a`; every one of them moved to `b`
        assert kit.requests_seen("a") >= 1
        assert kit.gateway.forwarder.retries == kit.requests_seen("a")


async def test_a_retry_never_goes_back_to_the_replica_that_just_failed() -> None:
    async with gateway_kit(max_retries=5, cooldown_failures=0) as kit:
        for name in ("a", "b", "c"):
            await kit.replica(name, failing())
        kit.mesh.dispatched.clear()
        status, _, body = await kit.post(chat())
        # every replica failed once: three attempts, three different replicas, then the last 5xx as it is
        assert status == 500
        assert sorted(kit.mesh.dispatched) == ["s-a", "s-b", "s-c"]
        assert json.loads(body)["error"]["code"] == "simulated_error"


async def test_transport_failure_is_retried_and_reported() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a")
        await kit.replica("b")
        kit.mesh.unreachable.add("s-a")
        for _ in range(8):
            status, headers, _ = await kit.post(chat())
            assert (status, headers["X-Otela-Session"]) == (200, "s-b")
        assert ("s-a", "peer_unreachable") in kit.mesh.failures


async def test_no_retry_beyond_max_retries() -> None:
    async with gateway_kit(max_retries=0) as kit:
        await kit.replica("a", failing())
        await kit.replica("b", failing())
        status, _, _ = await kit.post(chat())
        assert status == 500
        assert len(kit.mesh.dispatched) == 1


async def test_replica_failing_repeatedly_is_cooled_down() -> None:
    async with gateway_kit(cooldown_failures=2, cooldown_seconds=60, policy="round_robin") as kit:
        await kit.replica("a", failing())
        await kit.replica("b")
        for _ in range(10):
            status, _, _ = await kit.post(chat())
            assert status == 200
        health = kit.gateway.router.health
        assert health.is_cooling("s-a") and not health.is_cooling("s-b")
        seen = kit.requests_seen("a")
        assert seen == 2  # two failures in a row, then nothing more while cooling
        for _ in range(10):
            await kit.post(chat())
        assert kit.requests_seen("a") == seen
        metrics = (await (await kit.http.get(kit.url + "/metrics")).read()).decode()  # type: ignore[union-attr]
        assert 'otela_retries_total{model="sim-model",node="p-a"} 2.0' in metrics


async def test_everything_cooling_still_gets_tried() -> None:
    async with gateway_kit(cooldown_failures=1, cooldown_seconds=60, max_retries=0) as kit:
        await kit.replica("a", failing())
        assert (await kit.post(chat()))[0] == 500
        assert kit.gateway.router.health.is_cooling("s-a")
        assert (await kit.post(chat()))[0] == 500  # tried anyway: a 5xx from the engine, not a 503 from us
        assert kit.requests_seen("a") == 2


async def test_first_byte_timeout_moves_to_another_replica() -> None:
    async with gateway_kit(first_byte_timeout=0.3, policy="round_robin") as kit:
        await kit.replica("a", SimulatedConfig(model=MODEL, hang_after=0))
        await kit.replica("b")
        for _ in range(4):
            status, headers, _ = await kit.post(chat())
            assert (status, headers["X-Otela-Session"]) == (200, "s-b")


async def test_all_replicas_silent_is_a_504() -> None:
    async with gateway_kit(first_byte_timeout=0.2, max_retries=1) as kit:
        await kit.replica("a", SimulatedConfig(model=MODEL, hang_after=0))
        await kit.replica("b", SimulatedConfig(model=MODEL, hang_after=0))
        status, _, body = await kit.post(chat())
        assert status == 504
        assert json.loads(body)["error"]["code"] == "upstream_timeout"


async def test_total_timeout_is_a_504() -> None:
    async with gateway_kit(total_timeout=0.3) as kit:
        await kit.replica("a", SimulatedConfig(model=MODEL, ttft_ms=5000))
        status, _, body = await kit.post(chat())
        assert status == 504
        assert "deadline" in json.loads(body)["error"]["message"]


async def test_connect_timeout_bounds_opening_the_stream() -> None:
    async with gateway_kit(connect_timeout=0.2, max_retries=0) as kit:
        await kit.replica("a")
        original = kit.mesh.open_http_stream

        async def slow_open(target, timeout):  # type: ignore[no-untyped-def]
            async with asyncio.timeout(timeout):  # the mesh honours the timeout it is given, as the host does
                await asyncio.sleep(10)
            return await original(target, timeout)

        kit.mesh.open_http_stream = slow_open  # type: ignore[method-assign]
        kit.gateway.forwarder._open_stream = slow_open
        status, _, body = await kit.post(chat())
        assert status == 504
        assert json.loads(body)["error"]["type"] == "timeout_error"


async def test_node_without_a_running_engine_is_skipped_and_cooled_at_once() -> None:
    async with gateway_kit(policy="round_robin") as kit:
        kit.mesh.add(record("a"), None)  # the node answers, its engine is not serving
        await kit.replica("b")
        for _ in range(4):
            status, headers, _ = await kit.post(chat())
            assert (status, headers["X-Otela-Session"]) == (200, "s-b")
        assert kit.gateway.router.health.is_cooling("s-a")
        assert kit.mesh.dispatched.count("s-a") == 1


async def test_a_restarted_peer_is_reached_through_its_newest_session_only() -> None:
    async with gateway_kit() as kit:
        old = await kit.replica("a")
        kit.mesh.add(dataclasses.replace(old, session_id="s-a-old", started_at=old.started_at - 100), None)
        for _ in range(6):
            status, headers, _ = await kit.post(chat())
            assert (status, headers["X-Otela-Session"]) == (200, "s-a")
        assert "s-a-old" not in kit.mesh.dispatched
