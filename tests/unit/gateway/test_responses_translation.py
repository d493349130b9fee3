"""The Responses API over chat engines: request and answer translation, the event stream's order and shapes (as
the official SDK's own types parse them), refusals in OpenAI's error format, and the ingress routes end to end."""

from __future__ import annotations

import json
from typing import Any

import pytest
from meshkit import MODEL, gateway_kit, record
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from opentela.errors import InvalidRequestError
from opentela.gateway import responses
from opentela.gateway.responses_stream import ResponsesEventStream
from opentela.gateway.routing import OTELA_METADATA_KEYS

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, usage: Any = None) -> bytes:
    body: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "model": MODEL, "choices": []}
    if delta is not None or finish is not None:
        body["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        out.append((lines[0][7:], json.loads(lines[1][6:])))
    return out


def test_text_and_message_input_become_chat_messages() -> None:
    req = responses.parse_request(
        {
            "model": MODEL,
            "input": [
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Hi "},
                        {"type": "input_text", "text": "there"},
                    ],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Hello."}],
                },
                {"role": "user", "content": "Again"},
            ],
            "instructions": "You are terse.",
            "max_output_tokens": 9,
            "temperature": 0.2,
            "top_p": 0.5,
            "metadata": {"topic": "greeting", "trusted_providers": "lab-a"},
            "stream": True,
            "store": False,
        },
        OTELA_METADATA_KEYS,
    )
    chat = responses.chat_body(req, MODEL)
    assert chat["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again"},
    ]
    assert (chat["max_tokens"], chat["temperature"], chat["top_p"]) == (9, 0.2, 0.5)
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    # Routing options go on to the ingress; the client's own metadata stays for the Response it gets back.
    assert chat["metadata"] == {"trusted_providers": "lab-a"} and req.metadata == {"topic": "greeting"}
    plain = responses.chat_body(responses.parse_request({"model": MODEL, "input": "Hello"}), MODEL)
    assert plain == {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}]}


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "does not store"),
        ({"input": "x", "conversation": "conv_1"}, "conversation", "does not store"),
        ({"input": "x", "background": True}, "background", "nothing is stored"),
        ({}, "input", "needs an `input`"),
        ({"input": []}, "input", "non-empty list"),
        ({"input": 5}, "input", "non-empty list"),
        ({"input": ["hi"]}, "input[0]", "object"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role", "one of"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input[0].content[0]",
            "input_image",
        ),
        ({"input": [{"type": "function_call_output", "output": "1"}]}, "input[0]", "function_call_output"),
        ({"input": "x", "tools": [{"type": "function", "name": "f"}]}, "tools", "tools"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "positive integer"),
        ({"input": "x", "max_output_tokens": True}, "max_output_tokens", "positive integer"),
        ({"input": "x", "temperature": "hot"}, "temperature", "number"),
        ({"input": "x", "instructions": ["a"]}, "instructions", "string"),
        ({"input": "x", "metadata": "m"}, "metadata", "object"),
        ({"input": "x", "stream": "yes"}, "stream", "true or false"),
        ({"input": "x", "store": "no"}, "store", "true or false"),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format", "json_schema"),
    ],
)
def test_bad_requests_are_400_naming_the_field(body: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        responses.parse_request({"model": MODEL, **body})
    err = caught.value.to_openai()["error"]
    assert err["param"] == param and words in err["message"]
    assert (err["type"], err["code"], caught.value.status_code) == (
        "invalid_request_error",
        "invalid_request",
        400,
    )


def test_structured_output_maps_to_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    text = {"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}}
    req = responses.parse_request({"model": MODEL, "input": "x", "text": text})
    assert responses.chat_body(req, MODEL)["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "thing", "schema": schema, "strict": True},
    }
    assert req.text == text  # echoed in the Response


def test_a_whole_chat_answer_becomes_a_response_the_sdk_parses() -> None:
    req = responses.parse_request(
        {"model": "alias", "input": "Hi", "max_output_tokens": 3, "metadata": {"k": "v"}}
    )
    answer = responses.ResponsesAnswer(req, "org/served-model")
    chat = {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hello you"}, "finish_reason": "length"}
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
    }
    out = Response.model_validate(json.loads(answer.whole(200, json.dumps(chat).encode())))
    assert out.object == "response" and out.id.startswith("resp_") and out.model == "org/served-model"
    assert out.output_text == "Hello you"
    assert out.status == "incomplete" and out.incomplete_details is not None
    assert out.incomplete_details.reason == "max_output_tokens"
    assert out.usage is not None and (
        out.usage.input_tokens,
        out.usage.output_tokens,
        out.usage.total_tokens,
    ) == (7, 3, 10)
    assert out.metadata == {"k": "v"} and out.max_output_tokens == 3
    # Errors are OpenAI error JSON already, and anything that is not a chat answer is not made up into one.
    error = b'{"error": {"message": "bad", "type": "invalid_request_error", "param": null, "code": null}}'
    assert answer.whole(400, error) == error
    assert answer.whole(200, b"not json") == b"not json"
    assert answer.whole(200, b'{"choices": []}') == b'{"choices": []}'


def test_the_event_stream_follows_openais_order_in_any_chunking() -> None:
    req = responses.parse_request({"model": MODEL, "input": "Hi", "stream": True})
    stream = ResponsesEventStream(responses.ResponsesAnswer(req, MODEL))
    upstream = (
        _chunk({"role": "assistant", "content": ""})
        + _chunk({"content": "Hel"})
        + _chunk({"content": "lo"})
        + _chunk({}, finish="stop")
        + _chunk(usage={"prompt_tokens": 5, "completion_tokens": 2})
        + b"data: [DONE]\n\n"
    )
    # Pieces that cut events, lines and even the CRLF of a blank line apart.
    raw = upstream.replace(b"\n\n", b"\r\n\r\n")
    out = b"".join(stream.feed(raw[i : i + 7]) for i in range(0, len(raw), 7)) + stream.close()
    events = _events(out)
    kinds = [k for k, _ in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    parsed = [EVENTS.validate_python(d) for _, d in events]
    assert all(p.type == k for p, k in zip(parsed, kinds, strict=True))
    assert "".join(d["delta"] for k, d in events if k == "response.output_text.delta") == "Hello"
    done = parsed[-1].response
    assert done.status == "completed" and done.output_text == "Hello"
    assert done.usage is not None and (done.usage.input_tokens, done.usage.output_tokens) == (5, 2)
    assert stream.done and stream.close() == b""


def test_streams_that_end_early_or_fail_still_end_cleanly() -> None:
    req = responses.parse_request({"model": MODEL, "input": "Hi", "stream": True, "max_output_tokens": 1})
    cut = ResponsesEventStream(responses.ResponsesAnswer(req, MODEL))
    out = cut.feed(_chunk({"content": "A"}) + _chunk({}, finish="length")) + cut.close()
    events = _events(out)
    assert events[-1][0] == "response.incomplete"
    assert EVENTS.validate_python(events[-1][1]).response.incomplete_details.reason == "max_output_tokens"
    # No text at all still gives a message item, so clients find an (empty) output.
    empty = ResponsesEventStream(responses.ResponsesAnswer(req, MODEL))
    kinds = [k for k, _ in _events(empty.feed(b"data: [DONE]\n\n"))]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed" and len(kinds) == 8
    # The engine's error event goes on as it is (the SDKs raise it), and nothing follows it.
    broken = ResponsesEventStream(responses.ResponsesAnswer(req, MODEL))
    error = b'data: {"error": {"message": "engine died", "type": "server_error", "param": null, "code": null}}\n\n'
    out = broken.feed(_chunk({"content": "A"}) + error + b"data: [DONE]\n\n") + broken.close()
    assert out.endswith(error) and b"response.completed" not in out
    # Garbage between events is skipped rather than crashing the stream.
    odd = ResponsesEventStream(responses.ResponsesAnswer(req, MODEL))
    kinds = [
        k
        for k, _ in _events(
            odd.feed(b": ping\n\ndata: {nope\n\ndata: [1]\n\n" + _chunk({"content": "B"})) + odd.close()
        )
    ]
    assert kinds[-1] == "response.completed" and "response.output_text.delta" in kinds


# --- through a gateway ------------------------------------------------------------------------------------------
async def test_the_ingress_translates_for_chat_engines() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a")
        status, headers, body = await kit.post(
            {"model": MODEL, "input": "hello", "max_output_tokens": 4, "metadata": {"user": "u1"}},
            path="/v1/responses",
        )
        assert status == 200, body
        out = Response.model_validate(json.loads(body))
        assert out.status in ("completed", "incomplete") and out.output_text and out.model == MODEL
        assert out.usage is not None and out.usage.output_tokens >= 1 and out.metadata == {"user": "u1"}
        assert headers["X-Otela-Model"] == MODEL
        assert kit.http is not None
        async with kit.http.post(
            kit.url + "/v1/responses", json={"model": MODEL, "input": "hi", "stream": True}
        ) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
            events = _events(await resp.read())
        assert events[0][0] == "response.created"
        assert events[-1][0] in (
            "response.completed",
            "response.incomplete",
        )  # the simulator stops at its length
        assert all(EVENTS.validate_python(d).type == k for k, d in events)
        assert events[-1][1]["response"]["usage"]["output_tokens"] >= 1
        # Bad input never reaches an engine and gets OpenAI's error JSON.
        before = kit.requests_seen("a")
        status, _, body = await kit.post(
            {"model": MODEL, "input": "x", "previous_response_id": "r"}, path="/v1/responses"
        )
        assert status == 400 and json.loads(body)["error"]["param"] == "previous_response_id"
        status, _, body = await kit.post({"model": MODEL, "input": [{"role": "user"}]}, path="/v1/responses")
        assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"
        status, _, body = await kit.post({"input": "x"}, path="/v1/responses")
        assert status == 400 and json.loads(body)["error"]["param"] == "model"
        assert kit.requests_seen("a") == before


async def test_engines_that_serve_responses_get_the_request_as_it_came() -> None:
    async with gateway_kit() as kit:
        kit.mesh.add(record("v", engine="vllm"), "http://127.0.0.1:9")
        forwarder = kit.gateway.forwarder
        body = {
            "model": MODEL,
            "input": "hi",
            "tools": [{"type": "function", "name": "f"}],
            "metadata": {"policy": "random"},
        }
        call = forwarder.accept("r1", "/v1/responses", json.dumps(body).encode(), {}, 0.0)
        # Tools pass (the engine takes them); the ingress's routing option is taken out; nothing is translated.
        assert call.answer is None and call.events is None
        assert b"/v1/responses" in call.payload and b"/v1/chat/completions" not in call.payload
        assert json.loads(call.body.raw) == {"model": MODEL, "input": "hi", "tools": body["tools"]}
        call.__exit__(None, None, None)
        # One replica that needs translation among them: every request is translated, so any may serve it.
        await kit.replica("a")
        mixed = forwarder.accept("r2", "/v1/responses", b'{"model": "sim-model", "input": "hi"}', {}, 0.0)
        assert mixed.answer is not None and b"/v1/chat/completions" in mixed.payload
        mixed.__exit__(None, None, None)
    assert responses.serves_responses(record("x", settings={"responses_api": True}), MODEL)
    assert not responses.serves_responses(
        record("y", engine="vllm", settings={"responses_api": False}), MODEL
    )
    assert not responses.serves_responses(record("z", engine="no-such-engine"), MODEL)
    assert not responses.serves_responses(record("e", engine="embedded"), MODEL)
