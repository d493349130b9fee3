"""Per-request policy choice, body metadata handling, metrics labels and the Server-Timing stages."""

from __future__ import annotations

import json

from meshkit import chat, gateway_kit

from opentela.gateway.call import parse_body


def test_routing_options_leave_the_body_before_it_is_forwarded() -> None:
    raw = json.dumps(
        chat(metadata={"trusted_providers": ["a"], "require": "gpu=H100", "user": "u1"})
    ).encode()
    parsed = parse_body(raw)
    assert parsed.metadata == {"trusted_providers": ["a"], "require": "gpu=H100"}
    assert json.loads(parsed.raw)["metadata"] == {"user": "u1"}
    only_ours = parse_body(json.dumps(chat(metadata={"policy": "round_robin"})).encode())
    assert "metadata" not in json.loads(only_ours.raw)
    untouched = json.dumps(chat()).encode()
    assert parse_body(untouched).raw is untouched  # the common case forwards the very bytes received


async def test_request_may_choose_an_allowed_policy_only() -> None:
    async with gateway_kit(policy="random", request_policies=("round_robin",)) as kit:
        for name in ("a", "b", "c"):
            await kit.replica(name)
        sessions = [
            (await kit.post(chat(), {"X-Otela-Policy": "round_robin"}))[1]["X-Otela-Session"]
            for _ in range(6)
        ]
        assert sessions == ["s-a", "s-b", "s-c"] * 2
        status, _, body = await kit.post(chat(metadata={"policy": "least_loaded"}))
        assert status == 400
        assert "allowed: random, round_robin" in json.loads(body)["error"]["message"]


async def test_requests_cannot_choose_unless_the_operator_allows() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a")
        status, _, _ = await kit.post(chat(), {"X-Otela-Policy": "round_robin"})
        assert status == 400


async def test_metrics_by_model_and_node() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a")
        for _ in range(3):
            await kit.post(chat())
        await kit.post(chat(model="nope"))
        assert kit.http is not None
        async with kit.http.get(kit.url + "/metrics") as resp:
            text = await resp.text()
        assert 'otela_requests_total{model="sim-model",node="p-a",status="200"} 3.0' in text
        assert 'otela_time_to_first_byte_seconds_count{model="sim-model",node="p-a"} 3.0' in text
        assert 'otela_request_duration_seconds_count{model="sim-model",node="p-a"} 3.0' in text
        assert 'otela_request_bytes_total{model="sim-model",node="p-a"}' in text
        assert 'otela_response_bytes_total{model="sim-model",node="p-a"}' in text
        assert 'otela_in_flight{model="sim-model",node="p-a"} 0.0' in text
        assert 'otela_errors_total{code="model_not_found",model="-",node="-"} 1.0' in text


async def test_server_timing_names_every_stage() -> None:
    async with gateway_kit(server_timing=True) as kit:
        await kit.replica("a")
        status, headers, _ = await kit.post(chat())
        assert status == 200
        parts = [part.strip().split(";dur=") for part in headers["Server-Timing"].split(",")]
        stages = {name: float(ms) for name, ms in parts}
        assert list(stages) == ["parse", "route", "open", "upstream", "engine", "node", "reply"]
        # The serving node's own time and its engine's both sit inside what the ingress waited upstream.
        assert 0 <= stages["node"] and stages["engine"] + stages["node"] <= stages["upstream"] + 0.002
    async with gateway_kit() as kit:
        await kit.replica("a")
        _, headers, _ = await kit.post(chat())
        assert "Server-Timing" not in headers


class CountingPolicy:
    """An operator's policy, loaded by import path: always the last candidate, counting its hooks."""

    instances: list[CountingPolicy] = []

    def __init__(self) -> None:
        self.started = 0
        self.ended: list[bool] = []
        CountingPolicy.instances.append(self)

    def pick(self, candidates, request):  # type: ignore[no-untyped-def]
        return sorted(candidates, key=lambda r: r.session_id)[-1]

    def on_request_start(self, target, request) -> None:  # type: ignore[no-untyped-def]
        self.started += 1

    def on_request_end(self, target, request, *, ok, latency_s) -> None:  # type: ignore[no-untyped-def]
        self.ended.append(ok)


async def test_operator_policy_by_import_path_routes_and_hears_every_attempt() -> None:
    from meshkit import MODEL

    from opentela.engines.simulated import SimulatedConfig

    async with gateway_kit(policy="test_gateway_routes:CountingPolicy") as kit:
        await kit.replica("a")
        await kit.replica("b")
        await kit.replica("c", SimulatedConfig(model=MODEL, error_rate=1.0))
        for _ in range(3):
            status, headers, _ = await kit.post(chat())
            assert (status, headers["X-Otela-Session"]) == (200, "s-b")  # c failed, then the last of a, b
        policy = CountingPolicy.instances[-1]
        assert policy.started == 6 and sorted(policy.ended) == [False] * 3 + [True] * 3


def test_start_flag_selects_the_ingress_policy() -> None:
    from opentela.cli.main import build_parser
    from opentela.cli.start import config_flags
    from opentela.config import load_config

    args = build_parser().parse_args(["start", "--ingress", "--policy", "least_loaded"])
    config = load_config(None, env={}, flags=config_flags(args))
    assert config.gateway.policy == "least_loaded"
    env = {"OTELA_GATEWAY_REQUEST_POLICIES": "weighted,round_robin", "OTELA_GATEWAY_TRUSTED_PROVIDERS": "a"}
    config = load_config(None, env=env)
    assert config.gateway.request_policies == ("weighted", "round_robin")
    assert config.gateway.trusted_providers == ("a",)


async def test_access_log_line_carries_request_id_model_node_and_attempts(caplog) -> None:  # type: ignore[no-untyped-def]
    import logging

    from meshkit import MODEL

    from opentela.engines.simulated import SimulatedConfig

    caplog.set_level(logging.INFO, logger="opentela.gateway.access")
    async with gateway_kit(policy="round_robin") as kit:
        await kit.replica("a", SimulatedConfig(model=MODEL, error_rate=1.0))
        await kit.replica("b")
        status, headers, _ = await kit.post(chat(), {"X-Request-Id": "req-42"})
        assert status == 200 and headers["X-Otela-Request-Id"] == headers["X-Request-Id"] == "req-42"
    line = next(r for r in caplog.records if r.name == "opentela.gateway.access" and r.request_id == "req-42")
    assert (line.model, line.attempts, line.policy, line.node) == (MODEL, 2, "round_robin", "p-b"[-8:])
