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


@pytest.mark.parametrize(
    ("kind", "body", "param"),
    [
        ("chat", {"messages": [{"role": "user", "content": "x"}]}, "model"),
        ("chat", {"model": "m"}, "messages"),
        ("chat", {"model": "m", "messages": []}, "messages"),
        ("chat", {"model": "m", "messages": ["hi"]}, "messages[0]"),
        ("chat", {"model": "m", "messages": [{"role": "user"}], "stream": "yes"}, "stream"),
        ("chat", {"model": "m", "messages": [{"role": "user"}], "max_tokens": 0}, "max_tokens"),
        ("chat", {"model": "m", "messages": [{"role": "user"}], "temperature": "hot"}, "temperature"),
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
