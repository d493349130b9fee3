"""Checks on an inference request body before anything is forwarded: clear 400s, nothing reaches an engine."""

from __future__ import annotations

import json
from typing import Any

from opentela.errors import InvalidRequestError

ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}
_POSITIVE_INTS = ("max_tokens", "max_completion_tokens", "n")
_NUMBERS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")


def parse_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says what is wrong."""
    if not raw.strip():
        raise InvalidRequestError("the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a JSON object")
    return body


def validate(kind: str, body: dict[str, Any]) -> tuple[str, bool]:
    """(model, stream) of a well-formed request of `kind`; InvalidRequestError otherwise."""
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequestError("the request needs a `model` string", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequestError("`stream` must be true or false", param="stream")
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidRequestError("`messages` must be a non-empty list", param="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise InvalidRequestError(
                    f"messages[{i}] must be an object with a `role` string", param=f"messages[{i}]"
                )
    elif kind == "completions":
        if not isinstance(body.get("prompt"), (str, list)):
            raise InvalidRequestError("`prompt` must be a string or a list", param="prompt")
    elif kind == "embeddings":
        if not isinstance(body.get("input"), (str, list)) or not body.get("input"):
            raise InvalidRequestError("`input` must be a non-empty string or list", param="input")
        if stream:
            raise InvalidRequestError("embeddings cannot be streamed", param="stream")
    for name in _POSITIVE_INTS:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InvalidRequestError(f"`{name}` must be a positive integer", param=name)
    for name in _NUMBERS:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise InvalidRequestError(f"`{name}` must be a number", param=name)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequestError("`stream_options` must be an object", param="stream_options")
    return model, stream
