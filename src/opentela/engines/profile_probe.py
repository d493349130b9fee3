"""Timed streaming requests against a live OpenAI-compatible engine: time to first token and decode gaps.

The probe is what `otela profile` measures with. It knows nothing about grids or budgets: it answers "how long
until the first token of an L-token prompt" and "how long is one decode iteration of B requests of L tokens",
and turns every way an engine can fail into one of our errors with a one-line message.

Prompts are a filler word repeated, led by a tag unique to the request, so an engine with prefix caching (vLLM,
SGLang) can reuse nothing past the first few tokens and every prefill is a real one. How many filler words make L
tokens is calibrated once from the engine's own `usage.prompt_tokens`; the chat template's overhead is part of it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from opentela.errors import (
    ConfigError,
    EngineError,
    EngineUnavailableError,
    ModelNotFoundError,
    UpstreamTimeout,
)

FILLER = "the "
"""One token in every common BPE vocabulary (and four characters: one token by the four-characters estimate)."""
CALIBRATION_WORDS = (32, 160)
"""Prompt sizes, in filler words, of the two calibration requests."""
PREFILL_MAX_TOKENS = 1
"""Output tokens of a prefill request: the first token is all it is timed for."""
MIN_STEADY_GAPS = 8
"""Gaps per request wanted in the steady phase of a decode sample before it counts."""
DECODE_RETRIES = 2
"""Times a decode sample is rerun with twice the output tokens when its steady phase was too short."""


class BatchTooLargeError(EngineError):
    """The engine did not decode a whole batch at once: it queues requests past its own batch limit."""


@dataclass(frozen=True)
class PromptCalibration:
    """How many prompt tokens n filler words become: overhead + per_word * n (chat template included)."""

    overhead: float = 0.0
    per_word: float = 1.0
    reported: bool = False
    """Whether the engine reported usage.prompt_tokens; without it the filler is taken as one token a word."""

    def words_for(self, tokens: int) -> int:
        """Filler words for a prompt of about `tokens` tokens (at least one)."""
        return max(1, round((tokens - self.overhead) / self.per_word))

    @classmethod
    def fit(cls, words: Sequence[int], tokens: Sequence[int | None]) -> PromptCalibration:
        """The line through two (words, reported tokens) points; one token a word when a count is missing."""
        (w1, w2), (t1, t2) = words, tokens
        if t1 is None or t2 is None or w2 == w1 or t2 <= t1:
            return cls()
        per_word = (t2 - t1) / (w2 - w1)
        return cls(overhead=t1 - per_word * w1, per_word=per_word, reported=True)


@dataclass(frozen=True)
class StreamTimeline:
    """When one streamed request was sent and when each of its content chunks arrived (perf_counter seconds)."""

    sent: float
    chunks: tuple[float, ...]
    ended: float
    prompt_tokens: int | None


@dataclass(frozen=True)
class PrefillRun:
    """One prefill request: its time to first token and the prompt length the engine counted."""

    ttft_s: float
    prompt_tokens: int | None


@dataclass(frozen=True)
class DecodeRun:
    """One decode sample: the median iteration time of B concurrent streams while all of them decode."""

    iteration_s: float
    gaps: int
    prompt_tokens: int | None
    """The median prompt length the engine counted over the B requests."""
    max_tokens: int


def steady_gaps(chunk_times: Sequence[Sequence[float]]) -> list[float]:
    """Gaps between consecutive chunks of each stream inside the phase when every stream is decoding.

    That phase starts when the last stream got its first token (before it, prefills share the iterations) and ends
    when the first stream got its last one (after it, the batch is smaller).
    """
    if not chunk_times or any(len(times) < 2 for times in chunk_times):
        return []
    start = max(times[0] for times in chunk_times)
    end = min(times[-1] for times in chunk_times)
    return [b - a for times in chunk_times for a, b in itertools.pairwise(times) if a >= start and b <= end]


def _error_message(raw: bytes) -> tuple[str, str]:
    """(message, code) from an error body in the OpenAI shape, FastAPI's, or plain text."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace").strip()[:300], ""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        return str(err.get("message", "")), str(err.get("code") or "")
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])[:300], ""
    return str(body)[:300], ""


class EngineProbe:
    """Timed requests to one model on one engine: ``async with await EngineProbe.create(url, model) as probe``."""

    def __init__(self, base_url: str, model: str, *, read_timeout_s: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.max_model_len: int | None = None
        self.calibration = PromptCalibration()
        self._read_timeout_s = read_timeout_s
        self._tag = secrets.token_hex(3)  # differs between runs, so no run reuses another's cached prefixes
        self._serial = itertools.count()
        self._extra: dict[str, Any] = {"ignore_eos": True}  # vLLM, SGLang, llama.cpp: exactly max_tokens
        self._http: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"<EngineProbe {self.model} at {self.base_url}>"

    @classmethod
    async def create(cls, base_url: str, model: str, *, read_timeout_s: float = 120.0) -> EngineProbe:
        """Open a probe and check that the engine answers and serves `model`."""
        probe = cls(base_url, model, read_timeout_s=read_timeout_s)
        try:
            await probe._check_model()
        except BaseException:
            await probe.aclose()
            raise
        return probe

    async def aclose(self) -> None:
        """Close the HTTP client and its connections."""
        if self._http is not None:
            http, self._http = self._http, None
            await http.close()

    async def __aenter__(self) -> EngineProbe:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def _client(self) -> aiohttp.ClientSession:
        if self._http is None:
            # No connection limit: a decode sample opens one stream per request of its batch.
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self._read_timeout_s)
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout)
        return self._http

    def _unreachable(self, exc: BaseException) -> EngineUnavailableError:
        return EngineUnavailableError(f"cannot reach the engine at {self.base_url}: {exc}")

    async def _check_model(self) -> None:
        try:
            async with self._client.get(self.base_url + "/v1/models") as resp:
                raw = await resp.read()
                if resp.status != 200:
                    message, _ = _error_message(raw)
                    raise EngineError(
                        f"{self.base_url}/v1/models answered HTTP {resp.status}: {message or 'no message'}"
                    )
        except aiohttp.InvalidURL as exc:
            raise ConfigError(f"not an engine URL: {self.base_url!r}") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._unreachable(exc) from exc
        try:
            entries = [e for e in json.loads(raw)["data"] if isinstance(e, dict)]
        except (ValueError, KeyError, TypeError) as exc:
            raise EngineError(f"{self.base_url}/v1/models is not an OpenAI model list") from exc
        served = {str(e.get("id")): e for e in entries}
        if self.model not in served:
            raise ModelNotFoundError(
                f"the engine at {self.base_url} does not serve {self.model!r}; it serves: "
                + (", ".join(sorted(served)) or "nothing")
            )
        length = served[self.model].get("max_model_len")
        self.max_model_len = length if isinstance(length, int) and length > 0 else None

    def prompt(self, tokens: int) -> str:
        """A prompt of about `tokens` tokens under the current calibration, unique to this request."""
        return f"{self._tag}-{next(self._serial):06d} " + FILLER * self.calibration.words_for(tokens)

    async def _stream(self, content: str, max_tokens: int) -> StreamTimeline:
        """Send one streaming chat request and time its chunks; any failure raises."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self._extra,
        }
        url = self.base_url + "/v1/chat/completions"
        for attempt in range(2):
            answered = False
            try:
                sent = time.perf_counter()
                async with self._client.post(url, json=body) as resp:
                    answered = True
                    if resp.status != 200:
                        raise self._failure(resp.status, await resp.read())
                    return await self._read(resp, sent)
            except TimeoutError as exc:
                raise UpstreamTimeout(
                    f"the engine at {self.base_url} sent nothing for {self._read_timeout_s:g} s"
                ) from exc
            except aiohttp.ClientError as exc:
                if answered:
                    raise EngineError(f"the engine at {self.base_url} broke off a response: {exc!r}") from exc
                # Some servers (llama.cpp's) close a kept-alive connection after a stream without saying so;
                # the next request on it fails before any answer, and goes again once on a new connection.
                if attempt or not isinstance(exc, aiohttp.ClientConnectionError):
                    raise self._unreachable(exc) from exc
        raise AssertionError("unreachable")  # the loop returns or raises

    async def _read(self, resp: aiohttp.ClientResponse, sent: float) -> StreamTimeline:
        chunks: list[float] = []
        prompt_tokens = None
        async for raw in resp.content:
            now = time.perf_counter()
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return StreamTimeline(sent, tuple(chunks), now, prompt_tokens)
            try:
                event = json.loads(data)
            except ValueError as exc:
                raise EngineError(
                    f"the engine at {self.base_url} sent a malformed event: {data[:80]!r}"
                ) from exc
            if event.get("error"):
                message = event["error"].get("message", event["error"])
                raise EngineError(f"the engine at {self.base_url} failed mid-stream: {message}")
            usage = event.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
                prompt_tokens = usage["prompt_tokens"]
            for choice in event.get("choices") or ():
                delta = choice.get("delta") or {}
                # Reasoning models stream their first tokens as reasoning_content: those are tokens too.
                if delta.get("content") or delta.get("reasoning_content") or choice.get("text"):
                    chunks.append(now)
                    break
        raise EngineError(f"the stream from the engine at {self.base_url} ended before [DONE]")

    def _failure(self, status: int, raw: bytes) -> EngineError | ModelNotFoundError:
        message, code = _error_message(raw)
        if status == 404 and code == "model_not_found":
            return ModelNotFoundError(
                f"the engine at {self.base_url} does not serve {self.model!r}: {message}"
            )
        return EngineError(f"a request to the engine at {self.base_url} failed: HTTP {status}: {message}")

    async def _stream_lenient(self, content: str, max_tokens: int) -> StreamTimeline:
        """`_stream`, dropping the non-standard fields once if the engine refuses them."""
        try:
            return await self._stream(content, max_tokens)
        except EngineError as exc:
            if not self._extra or "HTTP 400" not in str(exc):
                raise
            self._extra = {}
            return await self._stream(content, max_tokens)

    async def calibrate(self) -> PromptCalibration:
        """Fit prompt words to tokens from two requests (they also warm the engine up)."""
        words = [w for w in CALIBRATION_WORDS if self.max_model_len is None or 2 * w < self.max_model_len]
        words = words if len(words) == 2 else [4, 16]
        self.calibration = PromptCalibration()
        counts = []
        for n in words:
            content = f"{self._tag}-{next(self._serial):06d} " + FILLER * n
            counts.append((await self._stream_lenient(content, PREFILL_MAX_TOKENS)).prompt_tokens)
        self.calibration = PromptCalibration.fit(words, counts)
        return self.calibration

    async def prefill(self, tokens: int) -> PrefillRun:
        """Time to first token of one request with a prompt of about `tokens` tokens."""
        line = await self._stream_lenient(self.prompt(tokens), PREFILL_MAX_TOKENS)
        # No content at all (an engine that stopped at once): the end of the stream is the first answer.
        first = line.chunks[0] if line.chunks else line.ended
        return PrefillRun(first - line.sent, line.prompt_tokens)

    async def _concurrently(self, tokens: int, max_tokens: int, batch: int) -> list[StreamTimeline]:
        """`batch` streams at once; the first failure cancels the rest and is raised as itself."""
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(self._stream(self.prompt(tokens), max_tokens)) for _ in range(batch)]
        except BaseExceptionGroup as group:
            # One clear line for the command line, not a group of the same failure B times over.
            raise group.exceptions[0] from None
        return [t.result() for t in tasks]

    async def decode(self, batch: int, tokens: int, max_tokens: int) -> DecodeRun:
        """One decode iteration of `batch` concurrent requests of about `tokens` prompt tokens each.

        Reruns with twice the output when the phase with all of them decoding held too few gaps; raises
        `BatchTooLargeError` when twice running they never decoded together at all.
        """
        for attempt in range(DECODE_RETRIES + 1):
            lines = await self._concurrently(tokens, max_tokens, batch)
            if any(len(line.chunks) < 2 for line in lines):
                raise EngineError(
                    f"decode at batch {batch}, {tokens} tokens: a request produced "
                    f"{min(len(line.chunks) for line in lines)} of {max_tokens} tokens (does the engine stop at "
                    "end-of-sequence despite ignore_eos?)"
                )
            gaps = steady_gaps([line.chunks for line in lines])
            if len(gaps) >= MIN_STEADY_GAPS * batch or (gaps and attempt == DECODE_RETRIES):
                counted = [line.prompt_tokens for line in lines if line.prompt_tokens is not None]
                prompt_tokens = round(statistics.median(counted)) if counted else None
                return DecodeRun(statistics.median(gaps), len(gaps), prompt_tokens, max_tokens)
            if not gaps and attempt >= 1:
                # Twice no overlap, the second time with twice the output: the engine runs fewer at once.
                raise BatchTooLargeError(
                    f"the engine never decoded {batch} requests at once (fewer slots than that?)", batch=batch
                )
            max_tokens *= 2
        raise AssertionError("unreachable")  # the last attempt returns or raises


__all__ = [
    "BatchTooLargeError",
    "DecodeRun",
    "EngineProbe",
    "PrefillRun",
    "PromptCalibration",
    "StreamTimeline",
    "steady_gaps",
]
