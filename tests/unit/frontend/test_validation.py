"""Malformed inference bodies get a 400 naming the problem."""

from __future__ import annotations

import pytest

from opentela.errors import InvalidRequestError
from opentela.openai_edge import parse_body, validate


@pytest.mark.parametrize(
    ("raw", "needle"),
    [(b"", "empty"), (b"{nope", "not valid JSON"), (b"[1]", "JSON object"), (b"\xff\xfe", "not valid JSON")],
)
def test_unparseable_bodies(raw: bytes, needle: str) -> None:
    with pytest.raises(InvalidRequestError, match=needle):
        parse_body(raw)


USER = {"role": "user", "content": "x"}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("kind", "body", "param"),
    [
        ("chat", {"messages": [{"role": "user", "content": "x"}]}, "model"),
        ("chat", {"model": "m"}, "messages"),
        ("chat", {"model": "m", "messages": []}, "messages"),
        ("chat", {"model": "m", "messages": ["hi"]}, "messages[0]"),
        ("chat", {"model": "m", "messages": [USER], "stream": "yes"}, "stream"),
        ("chat", {"model": "m", "messages": [USER], "max_tokens": 0}, "max_tokens"),
        ("chat", {"model": "m", "messages": [USER], "max_tokens": 4.5}, "max_tokens"),
        ("chat", {"model": "m", "messages": [USER], "max_tokens": True}, "max_tokens"),
        ("chat", {"model": "m", "messages": [USER], "max_completion_tokens": -1}, "max_completion_tokens"),
        ("chat", {"model": "m", "messages": [USER], "n": 0}, "n"),
        ("chat", {"model": "m", "messages": [USER], "temperature": "hot"}, "temperature"),
        ("chat", {"model": "m", "messages": [USER], "temperature": -1}, "temperature"),
        ("chat", {"model": "m", "messages": [USER], "temperature": 5}, "temperature"),
        ("chat", {"model": "m", "messages": [USER], "temperature": float("nan")}, "temperature"),
        ("chat", {"model": "m", "messages": [USER], "top_p": 2}, "top_p"),
        ("chat", {"model": "m", "messages": [USER], "presence_penalty": 3}, "presence_penalty"),
        ("chat", {"model": "m", "messages": [USER], "seed": "abc"}, "seed"),
        ("chat", {"model": "m", "messages": [USER], "stop": 5}, "stop"),
        ("chat", {"model": "m", "messages": [USER], "stop": ["a", 1]}, "stop"),
        ("chat", {"model": "m", "messages": [USER], "user": 7}, "user"),
        ("chat", {"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ("chat", {"model": "m", "messages": [{"content": "x"}]}, "messages[0].role"),
        ("chat", {"model": "m", "messages": [{"role": ["user"], "content": "x"}]}, "messages[0].role"),
        ("chat", {"model": "m", "messages": [{"role": "user"}]}, "messages[0].content"),
        ("chat", {"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ("chat", {"model": "m", "messages": [USER], "tools": "x"}, "tools"),
        ("chat", {"model": "m", "messages": [USER], "tools": [{"type": "function"}]}, "tools[0].function"),
        ("chat", {"model": "m", "messages": [USER], "tools": [7]}, "tools[0]"),
        ("chat", {"model": "m", "messages": [USER], "tool_choice": "required"}, "tool_choice"),
        (
            "chat",
            {"model": "m", "messages": [USER], "tool_choice": "sometimes", "tools": [TOOL]},
            "tool_choice",
        ),
        ("chat", {"model": "m", "messages": [USER], "response_format": "json"}, "response_format"),
        ("chat", {"model": "m", "messages": [USER], "response_format": {"type": "xml"}}, "response_format"),
        (
            "chat",
            {"model": "m", "messages": [USER], "response_format": {"type": "json_schema"}},
            "response_format",
        ),
        ("chat", {"model": "m", "messages": [USER], "logprobs": "yes"}, "logprobs"),
        ("chat", {"model": "m", "messages": [USER], "top_logprobs": 3}, "top_logprobs"),
        ("chat", {"model": "m", "messages": [USER], "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("completions", {"model": "m", "prompt": "x", "logprobs": 21}, "logprobs"),
        ("completions", {"model": "m", "prompt": "x", "logprobs": True}, "logprobs"),
        ("completions", {"model": "m"}, "prompt"),
        ("embeddings", {"model": "m", "input": ""}, "input"),
        ("embeddings", {"model": "m", "input": "x", "stream": True}, "stream"),
    ],
)
def test_invalid_fields_name_the_param(kind: str, body: dict, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        validate(kind, body)
    assert info.value.param == param and info.value.status_code == 400


def test_valid_requests() -> None:
    assert validate(
        "chat", {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    ) == (
        "m",
        True,
    )
    assert validate("completions", {"model": "m", "prompt": "x"}) == ("m", False)


def test_what_openai_accepts_passes() -> None:
    assistant_calls = {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function"}]}
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            assistant_calls,
            {"role": "tool", "content": "sunny", "tool_call_id": "1"},
        ],
        "temperature": 0,
        "top_p": 1.0,
        "presence_penalty": -2,
        "seed": 7,
        "stop": ["\n", "END"],
        "tools": [TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
        "logprobs": True,
        "top_logprobs": 20,
        "user": "someone",
        "some_engine_extension": {"anything": 1},
    }
    assert validate("chat", body) == ("m", False)
    assert validate("chat", {"model": "m", "messages": [USER], "tool_choice": "none"}) == ("m", False)
    assert validate("completions", {"model": "m", "prompt": [1, 2, 3], "logprobs": 20}) == ("m", False)


@pytest.mark.parametrize("raw", [b'{"model": "m", "top_p": NaN}', b'{"x": Infinity}', b'{"x": -1e999}'])
def test_numbers_json_cannot_hold_are_refused(raw: bytes) -> None:
    with pytest.raises(InvalidRequestError, match=r"not a JSON number|out of range"):
        parse_body(raw)


def test_bodies_in_any_json_encoding_still_parse() -> None:
    assert parse_body('{"model": "m", "t": 0.5}'.encode("utf-16")) == {"model": "m", "t": 0.5}
    assert parse_body(b'{"s": "\\ud800"}') == {"s": "\ud800"}  # a lone surrogate, as json.loads takes it


def test_llama_3s_tool_output_role_passes() -> None:
    body = {"model": "m", "messages": [USER, {"role": "ipython", "content": '{"temp": 20}'}]}
    assert validate("chat", body) == ("m", False)
