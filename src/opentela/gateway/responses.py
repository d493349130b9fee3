"""The Responses API (`POST /v1/responses`) over engines that only speak chat completions: a Responses request
becomes a chat request, and the chat answer becomes a Response object.

Engines that serve `/v1/responses` themselves (vLLM) get the request as it came (`serves_responses`). For the
others the ingress translates the subset a stateless chat engine can honour: text and message input, the
instructions, sampling and output limits, structured output and metadata. Nothing is stored, so
`previous_response_id` and `conversation` are refused with a 400 that says so, as are tools and non-text input,
which would otherwise be dropped without a word. The event stream of a streamed answer is in
`gateway/responses_stream.py`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from opentela.errors import InvalidRequestError, PluginError
from opentela.registry.record import NodeRecord

RESPONSES_PATH = "/v1/responses"
CHAT_PATH = "/v1/chat/completions"
RESPONSES_SETTING = "responses_api"
"""The model setting (an engine's `otela` object, copied into the record) that says it serves /v1/responses."""

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text", "text")
_UNSTORED = ("previous_response_id", "conversation")
_FINISH = {"length": "max_output_tokens", "content_filter": "content_filter"}
"""Chat finish reasons that leave a Response incomplete, and the reason it then gives."""


@dataclass(slots=True)
class ResponsesRequest:
    """What a Responses request asks for, as far as a chat engine can serve it."""

    messages: list[dict[str, Any]]
    stream: bool = False
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    """The client's metadata, echoed back in the Response (the ingress's own routing keys stay at the ingress)."""
    routing: dict[str, Any] = field(default_factory=dict)
    """Routing options found in `metadata` (trusted providers, constraints, policy), for the ingress."""
    response_format: dict[str, Any] | None = None
    text: dict[str, Any] = field(default_factory=lambda: {"format": {"type": "text"}})
    user: str | None = None
    reasoning_effort: str | None = None


def _bad(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or a list of content parts", where)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            shown = kind if isinstance(kind, str) else type(part).__name__
            raise _bad(
                f"{where}.content[{i}]: content of type {shown!r} is not supported on this model's engines; "
                "send input_text parts",
                f"{where}.content[{i}]",
            )
        texts.append(part["text"])
    return "".join(texts)


def _messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise _bad("`input` must be a string or a non-empty list of messages", "input")
    messages = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"{where} must be an object with `role` and `content`", where)
        kind = item.get("type", "message")
        if kind != "message":
            raise _bad(
                f"{where}: input items of type {kind!r} are not supported on this model's engines "
                "(only messages: tools and stored items need an engine that serves /v1/responses)",
                where,
            )
        asked = item.get("role")
        role = _ROLES.get(asked) if isinstance(asked, str) else None
        if role is None:
            raise _bad(f"{where}.role must be one of {', '.join(_ROLES)}", f"{where}.role")
        messages.append({"role": role, "content": _content_text(item.get("content"), where)})
    return messages


def _number(body: Mapping[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise _bad(f"`{name}` must be a number", name)
    return value


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and isinstance(fmt.get("schema"), dict):
        schema = {"name": fmt.get("name") or "output", "schema": fmt["schema"]}
        if isinstance(fmt.get("strict"), bool):
            schema["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": schema}
    raise _bad(
        "`text.format` must be of type text, json_object or json_schema (with a `schema`)", "text.format"
    )


def check_stateless(body: Mapping[str, Any]) -> None:
    """The rules every Responses request here follows, whichever engine serves it: nothing is stored, so no
    request may refer to an earlier one or ask to be kept for later; a 400 names the field."""
    for name in _UNSTORED:
        if body.get(name) is not None:
            raise _bad(
                f"`{name}` is not supported: this service does not store responses or conversations "
                "(every request is handled as `store: false`); send the whole conversation in `input`",
                name,
            )
    if body.get("background"):
        raise _bad("background responses are not supported: nothing is stored to poll later", "background")
    store = body.get("store")
    if store is not None and not isinstance(store, bool):
        raise _bad("`store` must be true or false", "store")
    if body.get("input") is None:
        raise _bad("the request needs an `input`: a string or a list of messages", "input")


def parse_request(body: Mapping[str, Any], routing_keys: tuple[str, ...] = ()) -> ResponsesRequest:
    """Check a Responses request body and read what a chat engine can serve; a 400 names the first problem.
    `routing_keys` are the `metadata` keys addressed to the ingress."""
    check_stateless(body)
    if body.get("tools"):
        raise _bad("tools are not supported on this model's engines through the Responses API", "tools")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("`stream` must be true or false", "stream")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _bad("`instructions` must be a string", "instructions")
    limit = body.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise _bad("`max_output_tokens` must be a positive integer", "max_output_tokens")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise _bad("`metadata` must be an object", "metadata")
    metadata = metadata or {}
    user = body.get("user")
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    req = ResponsesRequest(
        messages=_messages(body.get("input")),
        stream=bool(stream),
        instructions=instructions,
        max_output_tokens=limit,
        temperature=_number(body, "temperature"),
        top_p=_number(body, "top_p"),
        metadata={k: v for k, v in metadata.items() if k not in routing_keys},
        routing={k: v for k, v in metadata.items() if k in routing_keys},
        response_format=_response_format(body.get("text")),
        user=user if isinstance(user, str) else None,
        reasoning_effort=effort if isinstance(effort, str) else None,
    )
    if req.response_format is not None:
        req.text = dict(body["text"])
    return req


def chat_body(req: ResponsesRequest, model: str) -> dict[str, Any]:
    """The chat completion request that serves `req` on `model`."""
    messages = list(req.messages)
    if req.instructions:
        messages.insert(0, {"role": "system", "content": req.instructions})
    out: dict[str, Any] = {"model": model, "messages": messages}
    optional = {
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "response_format": req.response_format,
        "user": req.user,
        "reasoning_effort": req.reasoning_effort,
        "metadata": req.routing or None,  # taken out again by the ingress before the engine sees the body
    }
    out.update({k: v for k, v in optional.items() if v is not None})
    if req.stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}  # for the usage of `response.completed`
    return out


def new_id(prefix: str) -> str:
    """A fresh object id such as `resp_…` or `msg_…`."""
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_object(
    input_tokens: int, output_tokens: int, cached: int = 0, reasoning: int = 0
) -> dict[str, Any]:
    """A Response's `usage`."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input_tokens + output_tokens,
    }


def chat_usage(usage: Any) -> dict[str, Any] | None:
    """A chat answer's `usage` as a Response's, if it has one."""
    if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
        return None
    output = usage.get("completion_tokens")
    prompt_details = usage.get("prompt_tokens_details")
    cached = prompt_details.get("cached_tokens") if isinstance(prompt_details, dict) else None
    out_details = usage.get("completion_tokens_details")
    reasoning = out_details.get("reasoning_tokens") if isinstance(out_details, dict) else None
    return usage_object(
        usage["prompt_tokens"],
        output if isinstance(output, int) else 0,
        cached if isinstance(cached, int) else 0,
        reasoning if isinstance(reasoning, int) else 0,
    )


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    """An assistant message output item holding one output_text part."""
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def response_object(
    req: ResponsesRequest,
    model: str,
    response_id: str,
    created_at: int,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    incomplete: str | None = None,
) -> dict[str, Any]:
    """A Response object in OpenAI's shape (`output_text` is the SDK's own convenience, not sent)."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": req.reasoning_effort, "summary": None},
        "store": False,
        "temperature": req.temperature,
        "text": req.text,
        "tool_choice": "auto",
        "tools": [],
        "top_p": req.top_p,
        "truncation": "disabled",
        "usage": usage,
        "user": req.user,
        "metadata": req.metadata,
    }


def finish_status(finish_reason: Any) -> tuple[str, str | None]:
    """(status, incomplete reason) of a Response whose chat answer finished with `finish_reason`."""
    reason = _FINISH.get(finish_reason) if isinstance(finish_reason, str) else None
    return ("incomplete", reason) if reason else ("completed", None)


class ResponsesAnswer:
    """Turns the chat answer to one translated request into the client's Response (whole or streamed)."""

    def __init__(self, req: ResponsesRequest, model: str) -> None:
        self.req, self.model = req, model
        self.response_id = new_id("resp")
        self.created_at = int(time.time())

    def __repr__(self) -> str:
        return f"<ResponsesAnswer {self.response_id} model={self.model!r} stream={self.req.stream}>"

    def whole(self, status: int, body: bytes) -> bytes:
        """The Response for a whole chat answer; an error answer (or one that is not a chat completion) is
        passed on as it is, since it already is OpenAI error JSON."""
        if status != 200:
            return body
        try:
            chat = json.loads(body)
            choice = chat["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            return body
        text = message.get("content") if isinstance(message, dict) else None
        state, incomplete = finish_status(choice.get("finish_reason") if isinstance(choice, dict) else None)
        item = message_item(new_id("msg"), text if isinstance(text, str) else "", state)
        response = response_object(
            self.req,
            self.model,
            self.response_id,
            self.created_at,
            status=state,
            output=[item],
            usage=chat_usage(chat.get("usage")),
            incomplete=incomplete,
        )
        return json.dumps(response).encode()


@cache
def _adapter_serves_responses(engine: str) -> bool:
    from opentela.engines._registry import ENGINES  # the registry loads every built-in adapter once

    try:
        return bool(getattr(ENGINES.get(engine), "native_responses", False))
    except PluginError:
        return False


def serves_responses(record: NodeRecord, model: str) -> bool:
    """Whether the replica's engine serves /v1/responses itself: its adapter says so (`Engine.native_responses`)
    or the engine advertises the setting `responses_api = true`."""
    entry = next((m for m in record.models if m.id == model), None)
    if entry is None:
        return False
    flag = entry.settings.get(RESPONSES_SETTING)
    if isinstance(flag, bool):
        return flag
    return bool(entry.engine) and _adapter_serves_responses(entry.engine)
