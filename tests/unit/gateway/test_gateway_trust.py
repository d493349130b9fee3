"""Trust: allowlists from header, body and ingress default; no request ever reaches a provider outside its list."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from meshkit import chat, gateway_kit, record

from opentela.errors import InvalidRequestError, NoTrustedProviderError, OpenTelaError, PeerUnreachableError
from opentela.fabric.http_tunnel import TunnelResponseHead, encode_response_head
from opentela.fabric.memory import memory_stream_pair
from opentela.gateway._config import GatewayConfig
from opentela.gateway.forwarder import Forwarder
from opentela.gateway.metrics import GatewayMetrics
from opentela.gateway.policies import POLICIES, RoutedRequest
from opentela.gateway.routing import Router
from opentela.gateway.trust import parse_providers, resolve_allowlist


def test_provider_lists_parse_from_strings_and_lists() -> None:
    assert parse_providers(" a, b ,,", "h") == {"a", "b"}
    assert parse_providers(["a", " b"], "h") == {"a", "b"}
    assert parse_providers("", "h") is None
    assert parse_providers(None, "h") is None
    with pytest.raises(InvalidRequestError):
        parse_providers(["a", 3], "h")


def test_header_and_body_narrow_the_default_applies_otherwise() -> None:
    assert resolve_allowlist(None, None, ()) is None
    assert resolve_allowlist(None, None, ("x",)) == {"x"}
    assert resolve_allowlist("a,b", None, ("x",)) == {"a", "b"}
    assert resolve_allowlist("a,b", ["b", "c"], ()) == {"b"}
    assert resolve_allowlist("a", ["c"], ()) == frozenset()  # trusts nobody: a 503, never "anybody"


class HoardingPolicy:
    """A hostile policy: remembers every record it was ever shown and returns any of them."""

    name = "hoarding"

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.seen: list = []

    def pick(self, candidates, request):  # type: ignore[no-untyped-def]
        self.seen.extend(candidates)
        return self.rng.choice(self.seen)

    def on_request_start(self, target, request) -> None:  # type: ignore[no-untyped-def]
        pass

    def on_request_end(self, target, request, *, ok, latency_s) -> None:  # type: ignore[no-untyped-def]
        pass


class RecordsOnly:
    """A mesh holding records only; the forwarder's stream opener is replaced below."""

    def __init__(self, records) -> None:  # type: ignore[no-untyped-def]
        self.records = records

    def candidates(self, model):  # type: ignore[no-untyped-def]
        return list(self.records)

    def known_model_ids(self):  # type: ignore[no-untyped-def]
        return {"sim-model"}

    def model_replicas(self):  # type: ignore[no-untyped-def]
        return {"sim-model": list(self.records)}


PROVIDERS = ["p0", "p1", "p2", "p3"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    providers=st.lists(st.sampled_from(PROVIDERS), min_size=1, max_size=8),
    header=st.one_of(st.none(), st.lists(st.sampled_from(PROVIDERS), max_size=3)),
    body=st.one_of(st.none(), st.lists(st.sampled_from(PROVIDERS), max_size=3)),
    default=st.lists(st.sampled_from(PROVIDERS), max_size=2),
    policy=st.sampled_from([*sorted(POLICIES), "hoarding"]),
    outcomes=st.lists(st.sampled_from(["ok", "unreachable", "5xx"]), min_size=1, max_size=12),
    max_retries=st.integers(0, 4),
)
def test_no_request_is_ever_dispatched_outside_its_allowlist(
    providers, header, body, default, policy, outcomes, max_retries
) -> None:  # type: ignore[no-untyped-def]
    records = [record(f"n{i}", provider=p) for i, p in enumerate(providers)]
    config = GatewayConfig(
        policy="random",
        request_policies=tuple(POLICIES),
        trusted_providers=tuple(default),
        max_retries=max_retries,
    )
    router = Router(RecordsOnly(records), config)  # type: ignore[arg-type]
    hoarder = HoardingPolicy()
    router.policies["hoarding"] = hoarder
    dispatched: list[str] = []
    script = iter(outcomes * 20)

    async def open_stream(target, timeout):  # type: ignore[no-untyped-def]
        dispatched.append(target.provider_id)
        outcome = next(script)
        if outcome == "unreachable":
            raise PeerUnreachableError("down")
        ours, theirs = memory_stream_pair("/otela/http/1", "a", "b")
        status = 200 if outcome == "ok" else 503
        await theirs.write(encode_response_head(TunnelResponseHead(status, {})) + b"{}")
        await theirs.write_eof()
        return ours

    async def scenario() -> None:
        forwarder = Forwarder(config, router, open_stream, GatewayMetrics())
        # Earlier requests without a list let the hoarding policy see every record.
        for _ in range(3):
            everyone = {"X-Otela-Policy": policy, "X-Otela-Trusted-Providers": ",".join(PROVIDERS)}
            routing = router.routing_for(everyone, None)
            try:
                await forwarder.open(
                    lambda routing=routing: router.eligible("sim-model", routing),
                    b"",
                    RoutedRequest("r", "sim-model", False, 0),
                    routing.policy,
                    tried=set(),
                )
            except OpenTelaError:
                pass
        dispatched.clear()
        headers = {"X-Otela-Policy": policy}
        if header is not None:
            headers["X-Otela-Trusted-Providers"] = ",".join(header)
        metadata = {"trusted_providers": body} if body is not None else None
        routing = router.routing_for(headers, metadata)
        allow = routing.allowlist
        eligible = router.eligible("sim-model", routing)
        if not eligible:
            assert isinstance(router.explain_empty("sim-model", routing), NoTrustedProviderError)
            return
        try:
            await forwarder.open(
                lambda: router.eligible("sim-model", routing),
                b"",
                RoutedRequest("r", "sim-model", False, 0),
                routing.policy,
                tried=set(),
            )
        except OpenTelaError:
            pass  # failing is allowed; going elsewhere is not
        if allow is not None:
            assert set(dispatched) <= allow, (dispatched, allow)

    asyncio.run(scenario())


async def test_untrusted_replicas_are_filtered_and_an_empty_result_is_a_clear_503() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a", provider="lab-a")
        await kit.replica("b", provider="lab-b")
        for _ in range(6):
            status, headers, _ = await kit.post(chat(), {"X-Otela-Trusted-Providers": "lab-b"})
            assert (status, headers["X-Otela-Provider"]) == (200, "lab-b")
        status, _, _ = await kit.post(chat(metadata={"trusted_providers": ["lab-a"], "tag": "x"}))
        assert status == 200
        status, headers, body = await kit.post(chat(), {"X-Otela-Trusted-Providers": "lab-z"})
        assert status == 503
        assert "Retry-After" in headers
        import json

        error = json.loads(body)["error"]
        assert error["code"] == "no_trusted_provider"
        assert "no trusted provider serves model 'sim-model'" in error["message"]
        assert kit.requests_seen("a") == 1


async def test_ingress_default_allowlist() -> None:
    async with gateway_kit(trusted_providers=("lab-a",)) as kit:
        await kit.replica("a", provider="lab-a")
        await kit.replica("b", provider="lab-b")
        for _ in range(5):
            _, headers, _ = await kit.post(chat())
            assert headers["X-Otela-Provider"] == "lab-a"
        _, headers, _ = await kit.post(chat(), {"X-Otela-Trusted-Providers": "lab-b"})
        assert headers["X-Otela-Provider"] == "lab-b"
