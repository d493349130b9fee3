"""The OpenAI HTTP edge shared by the gateway and the frontend: request ids, error rendering, body rules,
the token estimate, SSE encoding and the inference paths. Plain functions, no web framework."""

from __future__ import annotations

import json
import math
import os
import random
import re
from collections.abc import Mapping
from typing import Any

from opentela.errors import InvalidRequestError, OpenTelaError

INFERENCE_PATHS: Mapping[str, str] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}
"""The OpenAI inference routes, each with the kind of body it takes."""

REQUEST_ID_HEADER = "X-Request-Id"
"""The header a client may name its request with."""
RESPONSE_ID_HEADER = "X-Otela-Request-Id"
"""The header every answer carries its request id in."""

_CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


# Fresh request ids are 128 random bits in hex, like a uuid4's, but drawn from a generator seeded once from the
# operating system: an id names a request in logs and headers and guards nothing, and uuid4's system call per
# request is measurable on the forwarding path. A forked child reseeds, so parent and child never share ids.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def request_id(given: str | None) -> str:
    """The client's id when it is a sane token (it is logged and forwarded), else a fresh one."""
    if given and _CLIENT_REQUEST_ID.fullmatch(given):
        return given
    return f"{_ids.getrandbits(128):032x}"


# --- errors -------------------------------------------------------------------------------------------------
JSON_CONTENT_TYPE = "application/json"
_BACKOFF_STATUSES = (429, 503)


def error_headers(err: OpenTelaError, request_id: str | None = None) -> dict[str, str]:
    """Headers of an error answer: the request id, Retry-After where SDKs should back off, the limit reset."""
    headers: dict[str, str] = {}
    if request_id:
        headers[RESPONSE_ID_HEADER] = request_id
    retry_after = err.details.get("retry_after")
    if retry_after is not None:
        # Retry-After takes whole seconds; rounding down would invite a retry that is refused again.
        headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    elif err.status_code in _BACKOFF_STATUSES:
        headers["Retry-After"] = "1"
    if "resets_at" in err.details:
        headers["X-Otela-Limit-Resets-At"] = str(int(err.details["resets_at"]))
    return headers


def error_body(err: OpenTelaError) -> dict[str, Any]:
    """The OpenAI error JSON of `err`, with a limit error's limit and reset time beside the usual fields."""
    body = err.to_openai()
    for extra in ("limit", "resets_at"):
        if extra in err.details:
            body["error"][extra] = err.details[extra]
    return body


def render_error(err: OpenTelaError, request_id: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, JSON body) of the answer that reports `err` before a response started."""
    return err.status_code, error_headers(err, request_id), json.dumps(error_body(err)).encode()


# --- request bodies -----------------------------------------------------------------------------------------
_POSITIVE_INTS = ("max_tokens", "max_completion_tokens", "n")
_NUMBERS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")


MAX_JSON_DEPTH = 128
"""Deepest nesting of arrays and objects a body may have; OpenAI bodies (tool schemas included) stay far below."""


def _too_deep(value: Any, limit: int) -> bool:
    # Level by level, without recursion: a recursive walk of a hostile body would itself run out of stack.
    level, depth = [value], 1
    while level:
        if depth > limit:
            return True
        deeper = []
        for node in level:
            for child in node.values() if type(node) is dict else node:
                if type(child) is dict or type(child) is list:
                    deeper.append(child)
        level, depth = deeper, depth + 1
    return False


def parse_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says what is wrong (never a 500, whatever the bytes)."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise InvalidRequestError(f"request body is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (UnicodeDecodeError, ValueError) as exc:
        # ValueError covers JSONDecodeError and integers past Python's digit limit (4,300 by default).
        if not raw.strip():
            raise InvalidRequestError("the request body is empty; send a JSON object") from None
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a JSON object")
    # Counting brackets is one fast pass in C; only a body with that many containers can be too deep.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _too_deep(body, MAX_JSON_DEPTH):
        raise InvalidRequestError(f"request body is nested deeper than {MAX_JSON_DEPTH} levels")
    return body


def model_and_stream(body: Mapping[str, Any]) -> tuple[str, bool]:
    """(model, stream): the rules every OpenAI route applies, at the gateway and the frontend alike."""
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequestError("the request needs a `model` string", param="model")
    stream = body.get("stream")
    if stream is None:  # absent, or null as OpenAI's schema allows: not streamed
        return model, False
    if stream is not True and stream is not False:
        raise InvalidRequestError("`stream` must be true or false", param="stream")
    return model, stream


def validate(kind: str, body: Mapping[str, Any]) -> tuple[str, bool]:
    """(model, stream) of a well-formed request of `kind` ("chat", "completions", "embeddings"); a 400 if not.

    The gateway applies only `model_and_stream` (engines check the rest); the frontend, which meters what it
    admits, applies all of this before anything is forwarded.
    """
    model, stream = model_and_stream(body)
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


# --- token estimate -----------------------------------------------------------------------------------------
CHARS_PER_TOKEN = 4
"""Roughly four characters of English per token for BPE tokenizers; used only where no tokenizer counted."""
CHAT_TOKENS_PER_MESSAGE = 4
"""Tokens the chat template adds around each message."""
DEFAULT_OUTPUT_TOKENS = 256
"""Output tokens assumed for load estimates when a request sets no max_tokens."""


def _tokens(chars: int) -> int:
    return 0 if chars <= 0 else (chars + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def estimate_text_tokens(text: str) -> int:
    """A tokenizer-free estimate: at least one token for any non-empty text."""
    return _tokens(len(text))


def _chars(value: Any) -> int:
    # Counts what " ".join of the parts would hold, without building the string: prompts can be large.
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_chars(v) for v in value) + max(0, len(value) - 1)
    if isinstance(value, dict):
        return _chars(value.get("text") or value.get("content") or "")
    return 0


def estimate_input_tokens(body: Mapping[str, Any]) -> int:
    """Estimated prompt tokens of a chat, completion or embedding request."""
    if "messages" in body:
        messages = body["messages"]
        total = 0
        if isinstance(messages, list):
            for m in messages:
                if isinstance(m, dict):
                    # The gateway runs this per request: a plain string content takes no further call.
                    content = m.get("text") or m.get("content") or ""
                    chars = len(content) if type(content) is str else _chars(content)
                    total += _tokens(chars) + CHAT_TOKENS_PER_MESSAGE
        return total
    if "prompt" in body:
        return _tokens(_chars(body["prompt"]))
    return _tokens(_chars(body.get("input", "")))


def output_allowance(body: Mapping[str, Any]) -> int:
    """The output tokens a request may produce: its max_(completion_)tokens, else `DEFAULT_OUTPUT_TOKENS`."""
    out = body.get("max_completion_tokens", body.get("max_tokens"))
    if isinstance(out, int) and not isinstance(out, bool) and out >= 0:
        return out
    return DEFAULT_OUTPUT_TOKENS


def estimate_request_tokens(body: Mapping[str, Any]) -> int:
    """Estimated prompt plus output tokens: what serving the request will cost a replica."""
    return estimate_input_tokens(body) + output_allowance(body)


# --- server-sent events -------------------------------------------------------------------------------------
SSE_CONTENT_TYPE = "text/event-stream"
SSE_DONE = b"data: [DONE]\n\n"
"""The event that ends an OpenAI stream."""


def sse_data(data: bytes) -> bytes:
    """One SSE event carrying `data` (a single line of JSON)."""
    return b"data: " + data + b"\n\n"


def sse_error_event(err: OpenTelaError) -> bytes:
    """The event that ends a stream which already started: its status line can no longer change."""
    return sse_data(json.dumps(err.to_openai()).encode())
