"""Prefix affinity: prompt prefix digests that successive turns share, and the policy keeping a conversation on
the replica that served it, falling back when that replica is overloaded or gone."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from typing import Any

from meshkit import MODEL, gateway_kit, record

from opentela.gateway._config import GatewayConfig
from opentela.gateway.call import parse_body
from opentela.gateway.policies import RoutedRequest, create_policy
from opentela.gateway.policies.prefix_affinity_policy import PrefixAffinityPolicy
from opentela.gateway.prompt_prefix import BLOCK_BYTES, prompt_prefix
from opentela.registry.record import NodeRecord

REPLICAS = [record("a"), record("b"), record("c")]


def conversation(name: str, turns: int, *, system: str = "You are terse.") -> list[list[dict[str, Any]]]:
    """The messages each turn of a chat sends: everything before, the last answer, a new question."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    out = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"{name}: question {t}?"})
        out.append(list(messages))
        messages.append({"role": "assistant", "content": f"{name}: answer {t}."})
    return out


def routed(messages: list[dict[str, Any]], i: int = 0, model: str = MODEL) -> RoutedRequest:
    payload = {"model": model, "messages": messages}
    return RoutedRequest(f"r{i}", model, False, 0, prefix=prompt_prefix(payload))


def serve(policy: PrefixAffinityPolicy, request: RoutedRequest, pool: list[NodeRecord] = REPLICAS) -> str:
    """One request picked, started and finished; the session it went to."""
    target = policy.pick(pool, request)
    policy.on_request_start(target, request)
    policy.on_request_end(target, request, ok=True, latency_s=0.1)
    return target.session_id


def test_each_turn_finds_the_prompt_the_turn_before_remembered() -> None:
    turns = [prompt_prefix({"model": MODEL, "messages": m}) for m in conversation("x", 4)]
    for earlier, later in itertools.pairwise(turns):
        assert earlier is not None and later is not None
        assert set(earlier.remember) <= set(later.keys)
    # Fields other than role, content and tool calls do not change a message's digest.
    first, second = conversation("x", 2)
    echoed = [*second[:2], {**second[2], "refusal": None, "reasoning_content": "hmm"}, second[3]]
    assert prompt_prefix({"model": MODEL, "messages": echoed}) == prompt_prefix(
        {"model": MODEL, "messages": second}
    )
    # The same prompt to another model, or another conversation, shares nothing.
    other_model = prompt_prefix({"model": "other", "messages": first})
    other_chat = prompt_prefix({"model": MODEL, "messages": conversation("y", 1)[0]})
    assert turns[0] is not None and other_model is not None and other_chat is not None
    assert not set(turns[0].remember) & (set(other_model.keys) | set(other_chat.keys))


def test_a_growing_completion_prompt_keeps_its_full_blocks() -> None:
    text = "".join(f"line {i} of a long shared document\n" for i in range(40))
    short = prompt_prefix({"model": MODEL, "prompt": text[: 3 * BLOCK_BYTES + 10]})
    longer = prompt_prefix({"model": MODEL, "prompt": text[: 3 * BLOCK_BYTES + 10] + " and more"})
    assert short is not None and longer is not None
    assert len(short.keys) == 4 and short.remember == (short.keys[2], short.keys[3])
    assert short.keys[2] in longer.keys and short.keys[3] not in longer.keys
    assert prompt_prefix({"model": MODEL, "input": "embed me"}) is None
    assert prompt_prefix({"model": MODEL, "prompt": [1, 2, 3]}) is None


def test_digests_are_computed_only_when_asked() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    assert parse_body(raw).prefix is None
    assert parse_body(raw, prefix=True).prefix is not None


def test_all_turns_of_a_conversation_go_to_one_replica() -> None:
    policy = PrefixAffinityPolicy(rng=random.Random(1))
    for name in ("x", "y", "z"):
        served = {serve(policy, routed(m)) for m in conversation(name, 6)}
        assert len(served) == 1, (name, served)
    assert policy.hits == 3 * 5 and policy.misses == 3


def test_different_conversations_spread_over_the_replicas() -> None:
    policy = PrefixAffinityPolicy(rng=random.Random(2))
    firsts = Counter(serve(policy, routed(conversation(f"c{i}", 1)[0])) for i in range(12))
    assert firsts == {"s-a": 4, "s-b": 4, "s-c": 4}
    # Conversations started together spread by load too.
    started = []
    for i in range(6):
        request = routed(conversation(f"d{i}", 1)[0], i)
        target = policy.pick(REPLICAS, request)
        policy.on_request_start(target, request)
        started.append(target.session_id)
    assert Counter(started) == {"s-a": 2, "s-b": 2, "s-c": 2}


def test_an_overloaded_replica_loses_the_conversation_which_then_stays_where_it_went() -> None:
    policy = PrefixAffinityPolicy(slack=2, rng=random.Random(3))
    turns = conversation("x", 3)
    home = serve(policy, routed(turns[0]))
    holder = next(r for r in REPLICAS if r.session_id == home)
    busy = [RoutedRequest(f"busy{i}", MODEL, False, 0) for i in range(3)]
    for request in busy:  # three in flight there, none elsewhere: more than 2 beyond the lightest
        policy.on_request_start(holder, request)
    moved = serve(policy, routed(turns[1], 1))
    assert moved != home and policy.moves == 1
    for request in busy:
        policy.on_request_end(holder, request, ok=True, latency_s=1.0)
    assert serve(policy, routed(turns[2], 2)) == moved  # the new mapping is remembered


def test_two_in_flight_within_the_slack_keep_the_conversation_home() -> None:
    policy = PrefixAffinityPolicy(slack=2, rng=random.Random(4))
    turns = conversation("x", 2)
    home = serve(policy, routed(turns[0]))
    holder = next(r for r in REPLICAS if r.session_id == home)
    for i in range(2):
        policy.on_request_start(holder, RoutedRequest(f"busy{i}", MODEL, False, 0))
    assert serve(policy, routed(turns[1], 1)) == home


def test_a_replica_no_longer_a_candidate_is_replaced() -> None:
    policy = PrefixAffinityPolicy(rng=random.Random(5))
    turns = conversation("x", 3)
    home = serve(policy, routed(turns[0]))
    rest = [r for r in REPLICAS if r.session_id != home]
    elsewhere = serve(policy, routed(turns[1], 1), rest)  # its node left, or this request does not trust it
    assert elsewhere != home
    assert serve(policy, routed(turns[2], 2)) == elsewhere


def test_entries_expire_and_the_table_is_bounded() -> None:
    now = [0.0]
    policy = PrefixAffinityPolicy(ttl=60.0, entries=4, clock=lambda: now[0], rng=random.Random(6))
    turns = conversation("x", 2)
    home = serve(policy, routed(turns[0]))
    now[0] = 59.0
    assert serve(policy, routed(turns[1])) == home
    now[0] = 200.0
    assert policy.replica_of(routed(turns[1]).prefix.remember[0]) is None  # type: ignore[union-attr]
    assert policy.stats()["entries"] == 0
    for i in range(10):
        serve(policy, routed(conversation(f"c{i}", 1)[0]))
    assert policy.stats()["entries"] == 4


def test_the_policy_is_built_from_the_gateway_settings() -> None:
    config = GatewayConfig(prefix_affinity_slack=1, prefix_affinity_ttl=30, prefix_affinity_entries=10)
    policy = create_policy("prefix_affinity", config)
    assert isinstance(policy, PrefixAffinityPolicy)
    assert (policy.slack, policy.ttl, policy.entries) == (1, 30.0, 10)


async def test_turns_through_the_gateway_stay_on_one_replica() -> None:
    async with gateway_kit(policy="prefix_affinity") as kit:
        for name in ("a", "b"):
            await kit.replica(name)
        homes = {}
        for c in range(4):
            sessions = set()
            for messages in conversation(f"c{c}", 4):
                status, headers, _ = await kit.post({"model": MODEL, "messages": messages, "max_tokens": 1})
                assert status == 200
                sessions.add(headers["X-Otela-Session"])
            assert len(sessions) == 1
            homes[c] = sessions.pop()
        assert set(homes.values()) == {"s-a", "s-b"}
        assert kit.gateway.router.uses_prefix
