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
ANSWER_ID_HEADERS = (RESPONSE_ID_HEADER, REQUEST_ID_HEADER)
"""Every answer names its request in both: ours, and the X-Request-Id that OpenAI's API answers with (which
its SDKs expose as the response's request id)."""

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
        headers[RESPONSE_ID_HEADER] = headers[REQUEST_ID_HEADER] = request_id
    retry_after = err.details.get("retry_after")
    if retry_after is not None:
        # Retry-After takes whole seconds; rounding down would invite a retry that is refused again.
        headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    elif err.status_code in _BACKOFF_STATUSES:
        headers["Retry-After"] = "1"
    if "resets_at" in err.details:
        headers["X-Otela-Limit-Resets-At"] = str(int(err.details["resets_at"]))
    if "allow" in err.details:  # a 405 says which methods the route takes (RFC 9110)
        headers["Allow"] = str(err.details["allow"])
    if err.status_code == 401:
        headers["WWW-Authenticate"] = "Bearer"
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


_TYPE_BY_STATUS = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
}
_OPENAI_TYPES = frozenset(
    ("invalid_request_error", "authentication_error", "permission_error", "rate_limit_error", "server_error")
)
_CONTEXT_ERRORS = ("exceed_context_size_error", "context_length_exceeded")
"""Engine error types (llama.cpp's, OpenAI's) for a prompt longer than the model's context window."""
_PROMPT_FIELD = {"chat": "messages", "completions": "prompt", "embeddings": "input"}


def engine_error_body(status: int, content: bytes, kind: str | None = None) -> bytes:
    """An engine's error answer in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}` with a
    string (or null) code: engines answer in their own words (llama.cpp puts its HTTP status in `code` and
    no `param`, vLLM puts `message` at the top level, FastAPI a `detail`), and SDKs read these four fields.
    An answer already in that shape (a serving node's own errors included) is returned as it is; other fields
    of the engine's error object are kept beside the four."""
    try:
        parsed = json.loads(content)
    except ValueError:  # not JSON (or not UTF-8): the text itself is the message
        parsed = None
    inner = parsed.get("error") if isinstance(parsed, dict) else None
    source: dict[str, Any] = inner if isinstance(inner, dict) else parsed if isinstance(parsed, dict) else {}
    etype, code, param = source.get("type"), source.get("code"), source.get("param")
    if (
        isinstance(inner, dict)
        and type(etype) is str
        and (code is None or type(code) is str)
        and "param" in inner
        and type(inner.get("message")) is str
    ):
        return content
    message = source.get("message") or source.get("detail") or (inner if isinstance(inner, str) else None)
    if message is None:
        text = content.decode("utf-8", "replace").strip()
        message = text[:1000] or f"the engine answered HTTP {status}"
    elif not isinstance(message, str):
        message = json.dumps(message)
    if type(code) is not str:
        # A number here is the engine repeating its HTTP status; its own kind of error says more.
        code = etype if type(etype) is str and etype not in _OPENAI_TYPES else None
    if code in _CONTEXT_ERRORS:
        code = "context_length_exceeded"
        param = param if type(param) is str else _PROMPT_FIELD.get(kind or "")
    error = {
        "message": message,
        "type": _TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error"),
        "param": param if type(param) is str else None,
        "code": code,
    }
    for key, value in source.items():
        if key not in error and key not in ("detail", "object"):
            error[key] = value
    return json.dumps({"error": error}).encode()


# --- request bodies -----------------------------------------------------------------------------------------
_POSITIVE_INTS = ("max_tokens", "max_completion_tokens", "n")


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


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# NaN, Infinity and numbers too large for a double are not JSON (RFC 8259): Python's parser takes them, but an
# engine refuses them in its own words, and a stored usage row holding one could no longer be listed as JSON.
_DECODER = json.JSONDecoder(parse_float=_finite, parse_constant=_no_constant)


def parse_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says what is wrong (never a 500, whatever the bytes)."""
    try:
        body = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
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


_ROLES = ("system", "developer", "user", "assistant", "tool", "function", "ipython")
"""OpenAI's message roles, and `ipython`: Llama 3's role for tool output, which its chat templates and vLLM take."""
_RANGES = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
"""OpenAI's ranges for the sampling numbers (inclusive)."""
_TOOL_CHOICES = ("none", "auto", "required")
_RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def validate(kind: str, body: Mapping[str, Any]) -> tuple[str, bool]:
    """(model, stream) of a well-formed request of `kind` ("chat", "completions", "embeddings"); a 400 if not.

    The gateway and the frontend both apply these rules before anything is forwarded: what OpenAI's API
    refuses is refused here, in its error shape with the field named, instead of reaching an engine that
    answers in its own words, ignores the field, or fails with a 500 that would count against its health.
    """
    model, stream = model_and_stream(body)
    check_fields(kind, body, stream)
    return model, stream


def check_fields(kind: str, body: Mapping[str, Any], stream: bool) -> None:
    """`validate` past `model` and `stream`, for a caller that has read those already (the gateway)."""
    if kind == "chat":
        _check_messages(body.get("messages"))
        _check_tools(body)
        logprobs = body.get("logprobs")
        if logprobs is not None and type(logprobs) is not bool:
            raise InvalidRequestError("`logprobs` must be true or false", param="logprobs")
        top = body.get("top_logprobs")
        if top is not None:
            if type(top) is not int or not 0 <= top <= 20:
                raise InvalidRequestError(
                    "`top_logprobs` must be an integer from 0 to 20", param="top_logprobs"
                )
            if logprobs is not True:
                raise InvalidRequestError("`top_logprobs` needs `logprobs` set to true", param="top_logprobs")
    elif kind == "completions":
        if not isinstance(body.get("prompt"), (str, list)):
            raise InvalidRequestError("`prompt` must be a string or a list", param="prompt")
        logprobs = body.get("logprobs")
        # OpenAI stops at 5; vLLM serves up to 20 (its default --max-logprobs), and its users ask for that many.
        if logprobs is not None and (type(logprobs) is not int or not 0 <= logprobs <= 20):
            raise InvalidRequestError("`logprobs` must be an integer from 0 to 20", param="logprobs")
    elif kind == "embeddings":
        if not isinstance(body.get("input"), (str, list)) or not body.get("input"):
            raise InvalidRequestError("`input` must be a non-empty string or list", param="input")
        if stream:
            raise InvalidRequestError("embeddings cannot be streamed", param="stream")
    for name in _POSITIVE_INTS:
        value = body.get(name)
        if value is not None and (type(value) is not int or value < 1):
            raise InvalidRequestError(f"`{name}` must be a positive integer", param=name)
    for name, (low, high) in _RANGES.items():
        value = body.get(name)
        # type() rather than isinstance(): true and false are ints to isinstance, not numbers to OpenAI.
        if value is not None and (type(value) not in (int, float) or not low <= value <= high):
            raise InvalidRequestError(f"`{name}` must be a number from {low:g} to {high:g}", param=name)
    seed = body.get("seed")
    if seed is not None and type(seed) is not int:
        raise InvalidRequestError("`seed` must be an integer", param="seed")
    stop = body.get("stop")
    if stop is not None and type(stop) is not str:
        if type(stop) is not list or not all(type(x) is str for x in stop):
            raise InvalidRequestError("`stop` must be a string or a list of strings", param="stop")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequestError("`stream_options` must be an object", param="stream_options")
    user = body.get("user")
    if user is not None and type(user) is not str:
        raise InvalidRequestError("`user` must be a string", param="user")


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("`messages` must be a non-empty list", param="messages")
    for i, m in enumerate(messages):
        if type(m) is not dict:
            raise InvalidRequestError(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = m.get("role")
        if type(role) is not str or role not in _ROLES:
            raise InvalidRequestError(
                f"messages[{i}].role must be one of {', '.join(_ROLES)}", param=f"messages[{i}].role"
            )
        content = m.get("content")
        if content is None:
            # Only an assistant turn may leave it out (it then carries tool calls).
            if role != "assistant":
                raise InvalidRequestError(
                    f"messages[{i}].content is required for role {role}", param=f"messages[{i}].content"
                )
        elif type(content) is not str and type(content) is not list:
            raise InvalidRequestError(
                f"messages[{i}].content must be a string or a list of content parts",
                param=f"messages[{i}].content",
            )


def _check_tools(body: Mapping[str, Any]) -> None:
    tools = body.get("tools")
    if tools is not None:
        if type(tools) is not list:
            raise InvalidRequestError("`tools` must be a list of tool objects", param="tools")
        for i, tool in enumerate(tools):
            if type(tool) is not dict or type(tool.get("type")) is not str:
                raise InvalidRequestError(f"tools[{i}] must be an object with a `type`", param=f"tools[{i}]")
            function = tool.get("function")
            if tool["type"] == "function" and (
                type(function) is not dict or type(function.get("name")) is not str
            ):
                raise InvalidRequestError(
                    f"tools[{i}].function must be an object with a `name` string",
                    param=f"tools[{i}].function",
                )
    choice = body.get("tool_choice")
    if choice is not None:
        if type(choice) is str:
            if choice not in _TOOL_CHOICES:
                raise InvalidRequestError(
                    f"`tool_choice` must be one of {', '.join(_TOOL_CHOICES)} or an object",
                    param="tool_choice",
                )
        elif type(choice) is not dict:
            raise InvalidRequestError("`tool_choice` must be a string or an object", param="tool_choice")
        if choice != "none" and not tools:
            raise InvalidRequestError(
                "`tool_choice` is only allowed when `tools` are given", param="tool_choice"
            )
    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if type(fmt) is dict else None
        if type(kind) is not str or kind not in _RESPONSE_FORMATS:
            raise InvalidRequestError(
                f"`response_format` must be an object whose type is one of {', '.join(_RESPONSE_FORMATS)}",
                param="response_format",
            )
        if kind == "json_schema" and type(fmt.get("json_schema")) is not dict:
            raise InvalidRequestError(
                "`response_format` of type json_schema needs a `json_schema` object", param="response_format"
            )


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
