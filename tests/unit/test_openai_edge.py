"""The shared OpenAI edge: request ids, error rendering, the `stream` rule, the token estimate and SSE."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opentela import openai_edge as edge
from opentela.errors import InvalidRequestError, NoHealthyReplicaError, OpenTelaError
from scripted_engine import LLAMA_CONTEXT_ERROR


def test_sane_client_request_ids_are_kept_others_replaced() -> None:
    assert edge.request_id("req-1.a:b_C") == "req-1.a:b_C"
    for bad in (None, "", "has space", "x" * 129, "new\nline", "é"):
        fresh = edge.request_id(bad)
        assert fresh != bad and len(fresh) == 32 and int(fresh, 16) >= 0
    assert edge.request_id(None) != edge.request_id(None)


def test_fresh_request_ids_are_distinct_hex_and_a_forked_child_draws_its_own() -> None:
    ids = {edge.request_id(None) for _ in range(20_000)}
    assert len(ids) == 20_000 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then leave without running the parent's cleanup
        os.write(write_end, edge.request_id(None).encode())
        os._exit(0)
    os.close(write_end)
    child_id = os.read(read_end, 64).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    assert len(child_id) == 32 and child_id != edge.request_id(None)


class Limited(OpenTelaError):
    status_code = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"


@pytest.mark.parametrize(
    ("retry_after", "header"), [(0.2, "1"), (1.0, "1"), (1.01, "2"), (40, "40"), (0, "1")]
)
def test_retry_after_rounds_the_detail_up_to_whole_seconds(retry_after: float, header: str) -> None:
    status, headers, _ = edge.render_error(Limited("slow down", retry_after=retry_after))
    assert (status, headers["Retry-After"]) == (429, header)


def test_backoff_statuses_without_detail_say_one_second_others_nothing() -> None:
    assert edge.render_error(NoHealthyReplicaError("none"))[1]["Retry-After"] == "1"
    assert "Retry-After" not in edge.render_error(InvalidRequestError("bad"))[1]


def test_error_body_and_headers() -> None:
    err = Limited("slow down", param="x", retry_after=3, limit="rpm", resets_at=1700000000.5)
    status, headers, body = edge.render_error(err, "rid")
    error = json.loads(body)["error"]
    assert status == 429 and headers["X-Otela-Request-Id"] == headers["X-Request-Id"] == "rid"
    assert headers["X-Otela-Limit-Resets-At"] == "1700000000"
    assert error == {
        "message": "slow down",
        "type": "rate_limit_error",
        "param": "x",
        "code": "rate_limit_exceeded",
        "limit": "rpm",
        "resets_at": 1700000000.5,
    }
    assert "X-Otela-Request-Id" not in edge.render_error(err)[1]


@pytest.mark.parametrize("stream", [1, 0, "true", "false", [], {}])
def test_stream_must_be_a_json_boolean(stream: object) -> None:
    with pytest.raises(InvalidRequestError, match="`stream` must be true or false") as info:
        edge.model_and_stream({"model": "m", "stream": stream})
    assert info.value.param == "stream" and info.value.status_code == 400


def test_stream_absent_or_null_is_false() -> None:
    assert edge.model_and_stream({"model": "m"}) == ("m", False)
    assert edge.model_and_stream({"model": "m", "stream": None}) == ("m", False)
    assert edge.model_and_stream({"model": "m", "stream": True}) == ("m", True)
    with pytest.raises(InvalidRequestError, match="model"):
        edge.model_and_stream({"model": "  "})


def test_parse_body() -> None:
    assert edge.parse_body(b'{"model": "m"}') == {"model": "m"}
    with pytest.raises(InvalidRequestError, match="empty"):
        edge.parse_body(b"  ")
    with pytest.raises(InvalidRequestError, match="JSON object"):
        edge.parse_body(b"[]")


def _joined(value: object) -> str:
    """The text the estimate counts, built the slow way."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return " ".join(_joined(v) for v in value)
    if isinstance(value, dict):
        return _joined(value.get("text") or value.get("content") or "")
    return ""


TEXTS = st.recursive(
    st.text(max_size=30) | st.none(),
    lambda inner: st.lists(inner, max_size=4) | st.fixed_dictionaries({"content": inner}),
    max_leaves=10,
)


@given(TEXTS)
def test_the_estimate_counts_the_joined_text_without_building_it(value: object) -> None:
    assert edge.estimate_input_tokens({"prompt": value}) == edge.estimate_text_tokens(_joined(value))


@given(st.lists(TEXTS, max_size=4))
def test_chat_messages_are_estimated_as_their_joined_text(contents: list[object]) -> None:
    messages = [{"role": "user", "content": c} for c in contents]
    expected = sum(edge.estimate_text_tokens(_joined(m)) + edge.CHAT_TOKENS_PER_MESSAGE for m in messages)
    assert edge.estimate_input_tokens({"messages": messages}) == expected


def test_token_estimates() -> None:
    chat = {"messages": [{"role": "user", "content": "a" * 40}, {"role": "assistant", "content": "abc"}]}
    assert edge.estimate_input_tokens(chat) == (10 + 4) + (1 + 4)
    assert edge.estimate_text_tokens("") == 0 and edge.estimate_text_tokens("a") == 1
    assert edge.estimate_request_tokens({**chat, "max_tokens": 7}) == 19 + 7
    assert edge.estimate_request_tokens({**chat, "max_completion_tokens": 3, "max_tokens": 7}) == 19 + 3
    assert edge.estimate_request_tokens({**chat, "max_tokens": True}) == 19 + edge.DEFAULT_OUTPUT_TOKENS


def test_sse_encoding() -> None:
    assert edge.sse_data(b'{"a": 1}') == b'data: {"a": 1}\n\n'
    assert edge.SSE_DONE == b"data: [DONE]\n\n"
    event = edge.sse_error_event(NoHealthyReplicaError("gone"))
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and event.count(b"\n") == 2
    assert json.loads(event[6:])["error"]["code"] == NoHealthyReplicaError.code


def test_inference_paths_name_their_body_kind() -> None:
    assert dict(edge.INFERENCE_PATHS) == {
        "/v1/chat/completions": "chat",
        "/v1/completions": "completions",
        "/v1/embeddings": "embeddings",
    }


def _error_of(status: int, content: bytes, kind: str | None = "chat") -> dict:
    return json.loads(edge.engine_error_body(status, content, kind))["error"]


def test_engine_errors_come_out_in_openai_shape() -> None:
    llama = LLAMA_CONTEXT_ERROR
    err = _error_of(400, json.dumps(llama).encode())
    assert (err["type"], err["code"], err["param"]) == (
        "invalid_request_error",
        "context_length_exceeded",
        "messages",
    )
    assert err["message"].startswith("request (5031 tokens)") and err["n_ctx"] == 2048
    assert _error_of(400, json.dumps(llama).encode(), "completions")["param"] == "prompt"
    vllm = {"object": "error", "message": "bad n", "type": "BadRequestError", "param": None, "code": 400}
    assert _error_of(400, json.dumps(vllm).encode()) == {
        "message": "bad n",
        "type": "invalid_request_error",
        "param": None,
        "code": "BadRequestError",
    }
    assert _error_of(422, b'{"detail": [{"loc": ["body"], "msg": "field required"}]}')["message"].startswith(
        "[{"
    )
    assert _error_of(500, b"boom\n") == {
        "message": "boom",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    assert _error_of(503, b"")["message"] == "the engine answered HTTP 503"
    assert _error_of(401, b'{"error": "no key"}')["type"] == "authentication_error"
    assert _error_of(501, b'{"error": {"code": 501, "message": "x", "type": "not_supported_error"}}')[
        "code"
    ] == ("not_supported_error")
    assert _error_of(400, b"\xff\xfe not utf-8")["type"] == "invalid_request_error"


def test_an_openai_shaped_engine_error_passes_unchanged() -> None:
    raw = json.dumps(NoHealthyReplicaError("none").to_openai()).encode()
    assert edge.engine_error_body(503, raw) is raw
    ours = {"error": {"message": "m", "type": "invalid_request_error", "param": "n", "code": None}}
    raw = json.dumps(ours).encode()
    assert edge.engine_error_body(400, raw) is raw


@given(st.binary(max_size=200), st.integers(min_value=400, max_value=599))
def test_any_engine_error_bytes_become_the_four_fields(content: bytes, status: int) -> None:
    out = edge.engine_error_body(status, content)
    err = json.loads(out)["error"]
    assert isinstance(err["message"], str) and isinstance(err["type"], str) and "param" in err
    assert err["code"] is None or isinstance(err["code"], str)
    if out is not content:  # rewritten: the type follows the status
        assert err["type"] in {
            "invalid_request_error",
            "authentication_error",
            "permission_error",
            "rate_limit_error",
            "server_error",
        }
