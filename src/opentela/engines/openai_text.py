"""OpenAI chat and completions for a model run token by token in this process: parse, generate, answer.

The gateway's split models and the tensor-parallel engine both tokenize, embed, run blocks, and sample here, and
answer in the OpenAI shape every other model answers in (one JSON body, or SSE chunks ending in `[DONE]`, usage
included when asked), so the frontend meters them the same way.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from opentela import openai_edge as edge
from opentela.errors import InvalidRequestError, OpenTelaError
from opentela.model.config import ModelConfig
from opentela.model.head import ClientHead
from opentela.model.sampling import SamplingParams, sample
from opentela.model.tokenizer import GGUFTokenizer, StreamDecoder

Step = Callable[[np.ndarray], Awaitable[np.ndarray]]
"""Runs every block on a step's hidden states ``[T, hidden]`` and returns the last block's."""

_UNSUPPORTED = (
    "tools",
    "functions",
    "tool_choice",
    "function_call",
    "logprobs",
    "top_logprobs",
    "echo",
    "suffix",
)
_MAX_STOPS = 4


@dataclass(frozen=True)
class TextRequest:
    """A validated OpenAI chat or completions request for a model this process runs token by token."""

    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool


def parse_request(
    kind: str,
    body: dict[str, Any],
    tokenizer: GGUFTokenizer,
    config: ModelConfig,
    cap: int,
    served_as: str = "models split across block servers",
) -> TextRequest:
    """Check `body` and tokenize its prompt; InvalidRequestError names what is wrong.

    `served_as` says, in errors about what is not supported, how the model is served ("models split across
    block servers").
    """
    for key in _UNSUPPORTED:
        if body.get(key) not in (None, False, [], 0):
            raise InvalidRequestError(f"`{key}` is not supported for {served_as}", param=key)
    if body.get("n", 1) != 1 or body.get("best_of", 1) != 1:
        raise InvalidRequestError(f"{served_as} generate one choice per request (n = 1)", param="n")
    tok = tokenizer
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidRequestError("`messages` must be a non-empty list", param="messages")
        text = tok.apply_chat_template(
            [_message(m, i, served_as) for i, m in enumerate(messages)], add_generation_prompt=True
        )
        prompt_ids = tok.encode(text)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids = tok.encode(prompt)
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            if not all(0 <= t < config.vocab_size for t in prompt):
                raise InvalidRequestError("token ids in `prompt` are outside the vocabulary", param="prompt")
            prompt_ids = list(prompt)
        else:
            raise InvalidRequestError("`prompt` must be a string, or a list of token ids", param="prompt")
    if not prompt_ids:
        raise InvalidRequestError("the prompt is empty", param="prompt")
    context = config.context_length
    room = context - len(prompt_ids)
    if room < 1:
        raise InvalidRequestError(
            f"the prompt has {len(prompt_ids)} tokens; this model's context is {context}", param="messages"
        )
    asked = body.get("max_completion_tokens", body.get("max_tokens"))
    if asked is None:
        max_tokens = min(room, cap)
    elif isinstance(asked, int) and not isinstance(asked, bool) and asked >= 1:
        if asked > room:
            raise InvalidRequestError(
                f"max_tokens {asked} plus the prompt's {len(prompt_ids)} tokens is over the context of {context}",
                param="max_tokens",
            )
        max_tokens = asked
    else:
        raise InvalidRequestError("max_tokens must be a positive integer", param="max_tokens")
    stops = body.get("stop")
    if stops is None:
        stop_list: tuple[str, ...] = ()
    elif isinstance(stops, str):
        stop_list = (stops,) if stops else ()
    elif isinstance(stops, list) and len(stops) <= _MAX_STOPS and all(isinstance(s, str) for s in stops):
        stop_list = tuple(s for s in stops if s)
    else:
        raise InvalidRequestError(
            f"`stop` must be a string or a list of at most {_MAX_STOPS} strings", param="stop"
        )
    try:
        sampling = SamplingParams(
            temperature=_number(body, "temperature", 1.0),
            top_p=_number(body, "top_p", 1.0),
            top_k=int(_number(body, "top_k", 0)),
            seed=body.get("seed") if isinstance(body.get("seed"), int) else None,
        )
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return TextRequest(
        kind == "chat", prompt_ids, max_tokens, sampling, stop_list, bool(body.get("stream")), include_usage
    )


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(f"`{key}` must be a number", param=key)
    return float(value)


def _message(m: Any, index: int, served_as: str) -> dict[str, str]:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise InvalidRequestError(f"messages[{index}] must be an object with a role", param="messages")
    content = m.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise InvalidRequestError(
                    f"messages[{index}]: {served_as} take text content parts only", param="messages"
                )
            parts.append(part["text"])
        content = "".join(parts)
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise InvalidRequestError(
            f"messages[{index}].content must be a string or text parts", param="messages"
        )
    return {"role": m["role"], "content": content}


class TextGeneration:
    """One request's generation, yielding text pieces as tokens come.

    `step` runs the blocks on new hidden states and returns theirs after the last block (a chain of block
    servers, a tensor-parallel replica); the embedding, the LM head and sampling run here, in a worker thread, so
    the event loop keeps serving other requests meanwhile.
    """

    def __init__(self, head: ClientHead, tokenizer: GGUFTokenizer, req: TextRequest, step: Step) -> None:
        self.head, self.tokenizer, self.req, self._step = head, tokenizer, req, step
        self.completion_tokens = 0
        self.finish_reason = "length"
        self.started = time.perf_counter()
        self.first_token_s: float | None = None
        self.head_s = 0.0
        """Time spent embedding and computing logits."""

    async def pieces(self) -> Any:
        """Async iterator of text pieces; stops at an end token, a stop string or max_tokens."""
        head, tok = self.head, self.tokenizer
        rng = np.random.default_rng(self.req.sampling.seed)
        decoder = StreamDecoder(tok)
        stop_ids = set(tok.stop_token_ids)
        held = ""  # text kept back while it could still be the start of a stop string
        keep = max((len(s) for s in self.req.stops), default=1) - 1
        hidden = await self._timed(head.embed, self.req.prompt_ids)
        while self.completion_tokens < self.req.max_tokens:
            out = await self._step(hidden)
            logits = await self._timed(head.logits, out[-1:])
            token = int(sample(np.asarray(logits).reshape(-1), self.req.sampling, rng))
            if self.first_token_s is None:
                self.first_token_s = time.perf_counter() - self.started
            if token in stop_ids:
                self.finish_reason = "stop"
                break
            self.completion_tokens += 1
            held += decoder.push(token)
            if self.req.stops:
                cut = min((i for s in self.req.stops if (i := held.find(s)) >= 0), default=-1)
                if cut >= 0:
                    if held[:cut]:
                        yield held[:cut]
                    self.finish_reason = "stop"
                    return
                if len(held) > keep:
                    yield held[: len(held) - keep]
                    held = held[len(held) - keep :]
            elif held:
                yield held
                held = ""
            if self.completion_tokens < self.req.max_tokens:
                hidden = await self._timed(head.embed, [token])
        held += decoder.flush() if hasattr(decoder, "flush") else ""
        if held:
            yield held

    async def _timed(self, fn: Callable[..., Any], arg: Any) -> Any:
        began = time.perf_counter()
        try:
            return await asyncio.to_thread(fn, arg)
        finally:
            self.head_s += time.perf_counter() - began

    def usage(self) -> dict[str, int]:
        """OpenAI usage of this generation so far."""
        prompt = len(self.req.prompt_ids)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.completion_tokens,
            "total_tokens": prompt + self.completion_tokens,
        }


def _dump(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


class OpenAIShape:
    """The OpenAI objects of one answer (ids, created time, model): a whole body or SSE chunks."""

    def __init__(self, model: str, chat: bool) -> None:
        self.model, self.chat = model, chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    def body(self, text: str, finish: str, usage: dict[str, int]) -> bytes:
        """A whole non-streaming answer."""
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice.update(logprobs=None, finish_reason=finish)
        return self._envelope(self.object, [choice], usage=usage)

    def _envelope(self, obj: str, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return _dump(
            {
                "id": self.id,
                "object": obj,
                "created": self.created,
                "model": self.model,
                "choices": choices,
                **extra,
            }
        )

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def chunk(self, text: str | None, *, first: bool = False, finish: str | None = None) -> bytes:
        """One SSE event carrying `text` (None: the final chunk with `finish`)."""
        if self.chat:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if first:
                delta["role"] = "assistant"
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text or ""}
        choice.update(logprobs=None, finish_reason=finish)
        return edge.sse_data(self._envelope(self._chunk_object, [choice]))

    def usage_chunk(self, usage: dict[str, int]) -> bytes:
        """The last event of a stream that asked for usage."""
        return edge.sse_data(self._envelope(self._chunk_object, [], usage=usage))


Write = Callable[[bytes], Awaitable[None]]


async def stream_answer(gen: TextGeneration, shape: OpenAIShape, write: Write) -> None:
    """Send the generation as SSE chunks; an error after the first byte becomes an error event."""
    first = True
    try:
        async for piece in gen.pieces():
            await write(shape.chunk(piece, first=first))
            first = False
        if first and shape.chat:
            await write(shape.chunk("", first=True))
        await write(shape.chunk(None, finish=gen.finish_reason))
        if gen.req.include_usage:
            await write(shape.usage_chunk(gen.usage()))
    except OpenTelaError as err:
        await write(edge.sse_error_event(err))
    await write(edge.SSE_DONE)


async def whole_answer(gen: TextGeneration, shape: OpenAIShape) -> bytes:
    """Generate to the end and return one JSON body."""
    text = "".join([piece async for piece in gen.pieces()])
    return shape.body(text, gen.finish_reason, gen.usage())
