"""The forwarder books every attempt exactly once: retried failures, successes, broken streams, clients leaving."""

from __future__ import annotations

import json
from collections import Counter

from meshkit import chat, record

from opentela._types import Stream
from opentela.errors import PeerUnreachableError
from opentela.fabric.http_tunnel import TunnelResponseHead, encode_response_head
from opentela.fabric.memory import memory_stream_pair
from opentela.gateway._config import GatewayConfig
from opentela.gateway.forwarder import Forwarder
from opentela.gateway.metrics import GatewayMetrics
from opentela.gateway.routing import Router
from opentela.registry.record import NodeRecord

SSE = {"content-type": "text/event-stream"}


class Records:
    """A mesh holding records only; streams come from the test's opener."""

    def __init__(self, *records: NodeRecord) -> None:
        self.records = list(records)

    def candidates(self, model):  # type: ignore[no-untyped-def]
        return list(self.records)

    def known_model_ids(self):  # type: ignore[no-untyped-def]
        return {"sim-model"}

    def model_replicas(self):  # type: ignore[no-untyped-def]
        return {"sim-model": list(self.records)}


class Booked:
    """A forwarder over `records` whose attempt starts and ends are counted."""

    def __init__(self, opener, *records: NodeRecord, **config) -> None:  # type: ignore[no-untyped-def]
        self.config = GatewayConfig(policy="round_robin", **config)
        self.router = Router(Records(*records), self.config)  # type: ignore[arg-type]
        self.started: list[str] = []
        self.ended: list[tuple[str, bool]] = []
        self.reported: list[tuple[str, str]] = []
        self.router.started = lambda target, routed: self.started.append(target.session_id)  # type: ignore[method-assign]
        self.router.ended = lambda target, routed, *, ok, latency_s: self.ended.append(
            (target.session_id, ok)
        )  # type: ignore[method-assign]
        self.metrics = GatewayMetrics()
        self.forwarder = Forwarder(
            self.config,
            self.router,
            opener,
            self.metrics,
            lambda target, err: self.reported.append((target.session_id, err.code)),
        )

    def accept(self, stream: bool = False, headers: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
        raw = json.dumps(chat(stream=stream)).encode()
        return self.forwarder.accept("rid", "/v1/chat/completions", raw, headers or {}, 0.0)

    def each_attempt_booked_once(self) -> None:
        assert Counter(self.started) == Counter(session for session, _ in self.ended)
        assert all(n == 1 for n in Counter(self.started).values())

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


async def answering(status: int, body: bytes, headers: dict[str, str] | None = None) -> tuple[Stream, Stream]:
    ours, theirs = memory_stream_pair("/otela/http/1", "a", "b")
    await theirs.write(encode_response_head(TunnelResponseHead(status, headers or {})) + body)
    return ours, theirs


def whole_answer(status: int, body: bytes):  # type: ignore[no-untyped-def]
    """An opener whose every stream holds a finished answer."""

    async def opener(target, timeout):  # type: ignore[no-untyped-def]
        ours, theirs = await answering(status, body)
        await theirs.write_eof()
        return ours

    return opener


async def test_a_retry_then_a_success_books_each_attempt_once() -> None:
    opened: list[str] = []

    async def opener(target, timeout):  # type: ignore[no-untyped-def]
        opened.append(target.session_id)
        if len(opened) == 1:
            raise PeerUnreachableError("down")
        ours, theirs = await answering(200, b'{"ok": true}')
        await theirs.write_eof()
        return ours

    kit = Booked(opener, record("a"), record("b"))
    with kit.accept() as call:
        assert await kit.forwarder.dispatch(call) == b'{"ok": true}'
    kit.each_attempt_booked_once()
    assert kit.ended == [(opened[0], False), (opened[1], True)]
    assert kit.reported == [(opened[0], "peer_unreachable")]
    assert kit.forwarder.retries == 1
    node = call.node
    assert kit.sample("otela_requests_total", model="sim-model", node=node, status="200") == 1
    assert kit.sample("otela_in_flight", model="sim-model", node=node) == 0
    assert (
        kit.sample(
            "otela_attempt_failures_total",
            model="sim-model",
            node="p" + opened[0][1:],
            code="peer_unreachable",
        )
        == 1
    )


async def test_an_engine_5xx_is_retried_and_the_last_one_passed_on_booked_once() -> None:
    kit = Booked(whole_answer(503, b'{"error": {}}'), record("a"), record("b"))
    with kit.accept() as call:
        await kit.forwarder.dispatch(call)
    kit.each_attempt_booked_once()
    assert [ok for _, ok in kit.ended] == [False, False]
    assert call.status == "503" and call.error is not None
    assert kit.sample("otela_errors_total", model="sim-model", node=call.node, code=call.error.code) == 1


async def test_a_stream_broken_after_its_first_byte_with_resume_off_is_booked_once_and_not_retried() -> None:
    peers: list[Stream] = []

    async def opener(target, timeout):  # type: ignore[no-untyped-def]
        ours, theirs = await answering(200, b'data: {"n": 1}\n\n', SSE)
        peers.append(theirs)
        return ours

    kit = Booked(opener, record("a"), record("b"))
    sent: list[bytes] = []

    async def write(chunk: bytes) -> None:
        sent.append(chunk)
        peers[0].reset(1, "engine died")

    with kit.accept(stream=True, headers={"X-Otela-Resume": "off"}) as call:
        first = await kit.forwarder.dispatch(call)
        err = await kit.forwarder.relay(call, first, write)
    assert sent == [b'data: {"n": 1}\n\n']
    assert err is not None and err.code == "engine_crashed"
    kit.each_attempt_booked_once()
    assert kit.ended == [(kit.started[0], False)]
    assert kit.forwarder.retries == 0 and len(peers) == 1
    assert kit.sample("otela_errors_total", model="sim-model", node=call.node, code="engine_crashed") == 1
    assert kit.sample("otela_response_bytes_total", model="sim-model", node=call.node) == len(sent[0])


async def test_a_client_leaving_mid_stream_is_booked_once_as_cancelled() -> None:
    async def opener(target, timeout):  # type: ignore[no-untyped-def]
        ours, _ = await answering(200, b'data: {"n": 1}\n\n', SSE)
        return ours

    kit = Booked(opener, record("a"))

    async def write(chunk: bytes) -> None:
        raise ConnectionResetError

    with kit.accept(stream=True) as call:
        first = await kit.forwarder.dispatch(call)
        try:
            await kit.forwarder.relay(call, first, write)
        except ConnectionResetError:
            kit.forwarder.client_gone(call)
    kit.each_attempt_booked_once()
    assert kit.ended == [("s-a", False)]
    assert kit.reported == []  # a client leaving says nothing about the replica
    assert kit.sample("otela_requests_total", model="sim-model", node="p-a", status="cancelled") == 1


async def test_a_whole_answer_is_booked_when_the_call_closes_after_the_client_has_it() -> None:
    kit = Booked(whole_answer(200, b'{"ok": true}'), record("a"))
    with kit.accept() as call:
        assert await kit.forwarder.dispatch(call) == b'{"ok": true}'
        # The answer is the client's to have now; its attempt is still open until the call closes.
        assert kit.ended == [] and kit.sample("otela_in_flight", model="sim-model", node="p-a") == 1
    kit.each_attempt_booked_once()
    assert kit.ended == [("s-a", True)]
    assert kit.sample("otela_in_flight", model="sim-model", node="p-a") == 0
    assert kit.sample("otela_time_to_first_byte_seconds_count", model="sim-model", node="p-a") == 1


async def test_a_client_gone_before_a_whole_answer_is_written_leaves_the_replica_booked_ok() -> None:
    kit = Booked(whole_answer(200, b'{"ok": true}'), record("a"))
    with kit.accept() as call:
        await kit.forwarder.dispatch(call)
        kit.forwarder.client_gone(call)  # the write to the client failed
    kit.each_attempt_booked_once()
    assert kit.ended == [("s-a", True)]  # the replica answered in full: no failure, no reset
    assert kit.reported == []
    assert kit.sample("otela_requests_total", model="sim-model", node="p-a", status="cancelled") == 1
