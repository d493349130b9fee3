"""Resuming broken streams: which requests may resume, the continuation built, and the splice the client sees."""

from __future__ import annotations

import json
from typing import Any

from meshkit import MODEL, chat, gateway_kit

from opentela.engines.simulated import SimulatedConfig
from opentela.gateway.resume import CHAT_PATH, COMPLETIONS_PATH, StreamSplice, resumable, wanted


def event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chat_chunk(
    rid: str, content: str | None = None, *, role: bool = False, finish: str | None = None
) -> bytes:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    body = {"id": rid, "object": "chat.completion.chunk", "created": 7 if rid == "a" else 9, "model": "m"}
    body.update(system_fingerprint=f"fp-{rid}", choices=[choice])
    return event(body)


def usage_chunk(rid: str, prompt: int, completion: int) -> bytes:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return event(
        {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [],
            "usage": usage,
        }
    )


def events(raw: bytes) -> list[Any]:
    out = []
    for block in raw.split(b"\n\n"):
        if block.startswith(b"data: "):
            data = block[6:]
            out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return out


CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 10, "stream": True}


def test_wanted_for_streamed_chats_and_completions_unless_opted_out() -> None:
    assert wanted(CHAT_PATH, True, {})
    assert wanted(COMPLETIONS_PATH, True, {"X-Otela-Resume": "on"})
    assert not wanted(CHAT_PATH, True, {"X-Otela-Resume": "off"})
    assert not wanted(CHAT_PATH, False, {})
    assert not wanted("/v1/embeddings", True, {})


def test_requests_that_cannot_continue_are_not_resumable() -> None:
    assert resumable(CHAT_PATH, CHAT)
    assert not resumable(CHAT_PATH, {**CHAT, "n": 2})
    assert not resumable(CHAT_PATH, {**CHAT, "logprobs": True, "top_logprobs": 2})
    assert not resumable(COMPLETIONS_PATH, {"prompt": [1, 2, 3]})
    assert not resumable(COMPLETIONS_PATH, {"prompt": ["a", "b"]})
    assert not resumable(COMPLETIONS_PATH, {"prompt": "x", "echo": True})
    assert resumable(COMPLETIONS_PATH, {"prompt": ["x"]})


def test_chat_continuation_appends_the_delivered_text_as_an_assistant_message() -> None:
    splice = StreamSplice(CHAT_PATH)
    out = splice.feed(chat_chunk("a", "", role=True) + chat_chunk("a", "Hello") + chat_chunk("a", " there"))
    assert len(events(out)) == 3
    body = splice.continuation(CHAT)
    assert body is not None
    assert body["messages"] == [*CHAT["messages"], {"role": "assistant", "content": "Hello there"}]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_tokens"] == 8
    assert CHAT["max_tokens"] == 10 and len(CHAT["messages"]) == 1  # the original is left alone


def test_a_client_continuing_its_own_message_gets_it_extended() -> None:
    own = {**CHAT, "messages": [*CHAT["messages"], {"role": "assistant", "content": "Once"}]}
    own["continue_final_message"], own["add_generation_prompt"] = True, False
    splice = StreamSplice(CHAT_PATH)
    splice.feed(chat_chunk("a", " upon"))
    body = splice.continuation(own)
    assert body is not None and body["messages"][-1] == {"role": "assistant", "content": "Once upon"}
    assert len(body["messages"]) == 2


def test_completion_continuation_extends_the_prompt() -> None:
    splice = StreamSplice(COMPLETIONS_PATH)
    chunk = {"id": "a", "object": "text_completion", "created": 1, "model": "m"}
    splice.feed(event({**chunk, "choices": [{"index": 0, "text": "one", "finish_reason": None}]}))
    splice.feed(event({**chunk, "choices": [{"index": 0, "text": " two", "finish_reason": None}]}))
    body = splice.continuation({"model": "m", "prompt": "Count:", "max_completion_tokens": 5, "stream": True})
    assert body is not None and body["prompt"] == "Count:one two" and body["max_completion_tokens"] == 3


def test_nothing_delivered_resends_the_original_request() -> None:
    splice = StreamSplice(CHAT_PATH)
    splice.feed(chat_chunk("a", "", role=True))
    assert splice.continuation(CHAT) == CHAT


def test_the_splice_keeps_the_first_ids_drops_the_second_role_and_fixes_usage() -> None:
    splice = StreamSplice(CHAT_PATH)
    first = splice.feed(chat_chunk("a", "", role=True) + chat_chunk("a", "x") + chat_chunk("a", "y"))
    splice.restart()
    second = splice.feed(
        chat_chunk("b", "", role=True)
        + chat_chunk("b", "z")
        + chat_chunk("b", None, finish="length")
        + usage_chunk("b", 5 + 2, 1)
        + b"data: [DONE]\n\n"
    )
    got = events(first + second)
    assert got[-1] == "[DONE]"
    chunks = got[:-1]
    assert {(c["id"], c["created"], c.get("system_fingerprint")) for c in chunks if "choices" in c} == {
        ("a", 7, "fp-a")
    }
    roles = [c["choices"][0]["delta"].get("role") for c in chunks if c["choices"]]
    assert roles.count("assistant") == 1
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "xyz"
    assert chunks[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def test_first_stream_usage_gives_the_original_prompt_tokens() -> None:
    splice = StreamSplice(CHAT_PATH)
    with_usage = json.loads(chat_chunk("a", "x")[6:])
    with_usage["usage"] = {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}
    splice.feed(event(with_usage))
    splice.restart()
    out = splice.feed(usage_chunk("b", 6, 2))
    assert events(out)[0]["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


def test_a_half_event_waits_and_is_dropped_when_its_stream_breaks() -> None:
    splice = StreamSplice(CHAT_PATH)
    whole = chat_chunk("a", "x")
    assert splice.feed(whole + whole[:10]) == whole
    splice.restart()
    assert splice.feed(chat_chunk("b", "y")) != b""
    assert splice.text == "xy"


def test_a_half_event_is_completed_by_the_next_chunk() -> None:
    splice = StreamSplice(CHAT_PATH)
    whole = chat_chunk("a", "x")
    assert splice.feed(whole[:10]) == b""
    assert splice.feed(whole[10:]) == whole
    assert splice.flush() == b""


def test_tool_calls_logprobs_and_finished_streams_do_not_resume() -> None:
    tool = json.loads(chat_chunk("a")[6:])
    tool["choices"][0]["delta"]["tool_calls"] = [{"index": 0, "function": {"name": "f"}}]
    splice = StreamSplice(CHAT_PATH)
    splice.feed(event(tool))
    assert not splice.can_resume and splice.continuation(CHAT) is None
    logprobs = json.loads(chat_chunk("a", "x")[6:])
    logprobs["choices"][0]["logprobs"] = {"content": []}
    splice = StreamSplice(CHAT_PATH)
    splice.feed(event(logprobs))
    assert not splice.can_resume
    splice = StreamSplice(CHAT_PATH)
    splice.feed(chat_chunk("a", "x", finish="stop"))
    assert not splice.can_resume


def test_all_tokens_delivered_leaves_nothing_to_continue() -> None:
    splice = StreamSplice(CHAT_PATH)
    splice.feed(chat_chunk("a", "x") + chat_chunk("a", "y"))
    assert splice.continuation({**CHAT, "max_tokens": 2}) is None


def test_unparseable_events_pass_through_and_block_a_resume() -> None:
    splice = StreamSplice(CHAT_PATH)
    assert splice.feed(b"data: not json\n\n") == b"data: not json\n\n"
    assert not splice.can_resume
    assert splice.feed(b"data: {}\n\n") == b"data: {}\n\n"


async def test_a_gateway_resumes_a_crashed_stream_into_one_stream() -> None:
    async with gateway_kit(policy="round_robin") as kit:
        await kit.replica("a", SimulatedConfig(model=MODEL, ttft_ms=1, itl_ms=1, crash_after=0))
        await kit.replica("b", SimulatedConfig(model=MODEL, ttft_ms=1, itl_ms=1, crash_after=0))
        await kit.replica("c", SimulatedConfig(model=MODEL, ttft_ms=1, itl_ms=1))
        body = chat(max_tokens=5, stream=True)
        body["stream_options"] = {"include_usage": True}
        async with kit.http.post(kit.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            got = events(await resp.read())
        assert got[-1] == "[DONE]"
        chunks = got[:-1]
        assert not any("error" in c for c in chunks)
        assert len({c["id"] for c in chunks}) == 1
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text == "lorem ipsum dolor sit amet "  # each replica went on where the last one stopped
        usage = chunks[-1]["usage"]
        assert usage["completion_tokens"] == 5
        assert usage["total_tokens"] == usage["prompt_tokens"] + 5
        seen = [kit.requests_seen(r) for r in "abc"]
        assert max(seen) == 1 and kit.requests_seen("c") == 1  # no replica asked twice, the healthy one last
        counter = kit.gateway.metrics.resumes
        resumes = sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total"))
        assert resumes == sum(seen) - 1 >= 1


def test_crlf_events_pass_through_at_once() -> None:
    splice = StreamSplice(CHAT_PATH)
    assert splice.feed(b"data: {}\r\n\r\n") == b"data: {}\r\n\r\n"
    assert not splice.can_resume
