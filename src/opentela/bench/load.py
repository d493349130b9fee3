"""`otela bench load`: open-loop load against any OpenAI-compatible endpoint, with a JSON report.

Requests leave on schedule (Poisson arrivals or a trace's timestamps) whether or not earlier ones have
finished, so a slow server shows up as latency, not as a politely reduced offered load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from opentela.bench.report import Outcome, build_report
from opentela.bench.traces import TRACE_FORMATS, TraceRecord, parse_model_map, write_trace
from opentela.bench.workload import LengthDistribution, PlannedRequest, poisson_plan, prompt_of, trace_plan
from opentela.errors import ConfigError


@dataclass(frozen=True)
class LoadSettings:
    """Where and what to send."""

    url: str
    """Base URL of the API, e.g. http://127.0.0.1:8092/v1."""
    model: str
    endpoint: str = "chat"
    stream: bool = True
    api_key: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = 600.0
    ignore_eos: bool = False
    distinct_prompts: bool = False
    """Give every request its own random words instead of one repeated word (no shared prefixes)."""

    def request_url(self) -> str:
        """The POST target."""
        path = "/chat/completions" if self.endpoint == "chat" else "/completions"
        return self.url.rstrip("/") + path

    def body(self, planned: PlannedRequest) -> dict[str, Any]:
        """The JSON body of one request."""
        # The salt depends only on the planned request, so a replay sends the same prompts again.
        salt = (
            hash((planned.at, planned.input_tokens, planned.output_tokens)) if self.distinct_prompts else None
        )
        prompt = prompt_of(planned.input_tokens, salt)
        body: dict[str, Any] = {"model": self.model, "max_tokens": planned.output_tokens}
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            body["ignore_eos"] = True  # vLLM and SGLang: generate exactly max_tokens
        return body


def _error_code(status: int, raw: bytes) -> str:
    try:
        return str(json.loads(raw)["error"]["code"] or f"http_{status}")
    except (ValueError, KeyError, TypeError):
        return f"http_{status}"


async def send_one(
    http: aiohttp.ClientSession, settings: LoadSettings, planned: PlannedRequest, t0: float
) -> Outcome:
    """Send one request and time it; failures become outcomes, never exceptions."""
    sent = time.perf_counter()
    outcome = Outcome(sent_at=sent - t0, ok=False, input_tokens=planned.input_tokens)
    headers = dict(settings.headers)
    if settings.api_key:
        headers["Authorization"] = f"Bearer {settings.api_key}"
    try:
        async with http.post(settings.request_url(), json=settings.body(planned), headers=headers) as resp:
            outcome.status = resp.status
            outcome.node = resp.headers.get("X-Otela-Node", "")
            if resp.status != 200:
                outcome.error = _error_code(resp.status, await resp.read())
                outcome.e2e = time.perf_counter() - sent
                return outcome
            if settings.stream:
                await _read_stream(resp, outcome, sent)
            else:
                payload = await resp.json(content_type=None)
                outcome.e2e = outcome.ttft = time.perf_counter() - sent
                usage = payload.get("usage") or {}
                outcome.output_tokens = int(usage.get("completion_tokens") or planned.output_tokens)
                outcome.input_tokens = int(usage.get("prompt_tokens") or planned.input_tokens)
                outcome.ok = True
    except TimeoutError:
        outcome.error = "client_timeout"
    except aiohttp.ClientError as exc:
        outcome.error = f"connection_error:{type(exc).__name__}"
    except (ValueError, KeyError, TypeError) as exc:
        outcome.error = f"bad_response:{type(exc).__name__}"
    if outcome.e2e is None:
        outcome.e2e = time.perf_counter() - sent
    return outcome


async def _read_stream(resp: aiohttp.ClientResponse, outcome: Outcome, sent: float) -> None:
    last = None
    chunks = 0
    usage_tokens = None
    done = False
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            break
        event = json.loads(data)
        if "error" in event:
            outcome.error = f"stream_error:{(event['error'] or {}).get('code', 'unknown')}"
            outcome.e2e = time.perf_counter() - sent
            return
        if event.get("usage"):
            usage_tokens = event["usage"].get("completion_tokens")
            outcome.input_tokens = int(event["usage"].get("prompt_tokens") or outcome.input_tokens)
        choices = event.get("choices") or []
        text = ""
        if choices:
            choice = choices[0]
            text = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
        if text:
            now = time.perf_counter()
            if last is None:
                outcome.ttft = now - sent
            else:
                outcome.itls.append(now - last)
            last = now
            chunks += 1
    outcome.e2e = time.perf_counter() - sent
    outcome.output_tokens = int(usage_tokens) if usage_tokens is not None else chunks
    if not done:  # the connection ended cleanly but the answer did not: a cut stream, not a short answer
        outcome.error = "stream_truncated"
        return
    outcome.ok = outcome.ttft is not None or outcome.output_tokens == 0


async def run_load(
    plan: Iterable[PlannedRequest],
    settings: LoadSettings,
    *,
    total: int | None = None,
    duration: float | None = None,
    progress: bool = True,
    on_outcome: Callable[[Outcome], None] | None = None,
    executed: list[tuple[PlannedRequest, Outcome]] | None = None,
) -> tuple[list[Outcome], float]:
    """Send the plan open loop; returns every outcome and the elapsed seconds (until the last one ended).

    `executed`, when given, receives each planned request with its outcome (whose `sent_at` is when it left).
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    outcomes: list[Outcome] = []
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=settings.timeout)
    bar = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} done, {task.fields[errors]} errors"),
        TimeElapsedColumn(),
        disable=not progress,
        transient=False,
        redirect_stdout=False,
        console=None,
    )
    with bar:
        async with (
            aiohttp.ClientSession(connector=connector, timeout=timeout) as http,
            asyncio.TaskGroup() as tg,
        ):
            task_id = bar.add_task("load", total=total, errors=0)
            errors = 0

            def done(outcome: Outcome) -> None:
                nonlocal errors
                outcomes.append(outcome)
                errors += not outcome.ok
                bar.update(task_id, advance=1, errors=errors)
                if on_outcome is not None:
                    on_outcome(outcome)

            async def one(planned: PlannedRequest, t0: float) -> None:
                outcome = await send_one(http, settings, planned, t0)
                if executed is not None:
                    executed.append((planned, outcome))
                done(outcome)

            t0 = time.perf_counter()
            sent = 0
            for planned in plan:
                delay = t0 + planned.at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tg.create_task(one(planned, t0))
                sent += 1
                if total is None:
                    bar.update(task_id, total=sent)
    return outcomes, time.perf_counter() - t0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `otela bench load`."""
    p.add_argument("--url", default="http://127.0.0.1:8092/v1", help="base URL of the OpenAI API")
    p.add_argument("--model", required=True, help="model to request")
    p.add_argument("--rate", type=float, default=1.0, help="Poisson arrival rate, requests/s")
    p.add_argument("--duration", type=float, help="seconds of arrivals (default 30 unless --requests)")
    p.add_argument("--requests", type=int, help="number of requests")
    p.add_argument("--trace", metavar="FILE", help="replay a trace's arrivals and lengths (docs/traces.md)")
    p.add_argument("--trace-format", choices=TRACE_FORMATS, default="auto", help="the trace's format (auto)")
    p.add_argument(
        "--trace-model",
        action="append",
        default=[],
        metavar="NAME",
        help="replay only the trace's requests for this model (repeatable; all of them are sent to --model)",
    )
    p.add_argument("--speedup", type=float, default=1.0, help="divide trace timestamps by this")
    p.add_argument("--input-len", default="128", help="prompt tokens: N, uniform:LO:HI, exp:MEAN, ...")
    p.add_argument("--output-len", default="64", help="output tokens: N, uniform:LO:HI, exp:MEAN, ...")
    p.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    p.add_argument("--no-stream", action="store_true", help="non-streaming requests (TTFT = E2E)")
    p.add_argument("--ignore-eos", action="store_true", help="ask vLLM/SGLang for exactly max_tokens")
    p.add_argument(
        "--distinct-prompts",
        action="store_true",
        help="random words per request, so no two prompts share a prefix (default: one repeated word, which a "
        "prefix cache serves from memory after the first request)",
    )
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", ""), help="bearer token")
    p.add_argument("--header", action="append", default=[], metavar="K:V", help="extra header (repeatable)")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    p.add_argument("--seed", type=int, default=0, help="seed of arrivals and lengths")
    p.add_argument("--out", metavar="FILE", help="write the JSON report here (it always goes to stdout)")
    p.add_argument(
        "--record",
        metavar="FILE",
        help="write the requests as actually sent, as a trace (.csv or .jsonl; docs/traces.md)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def plan_from_args(args: argparse.Namespace) -> tuple[list[PlannedRequest], int]:
    """The requests to send, from the flags."""
    if args.trace:
        plan = trace_plan(
            args.trace,
            speedup=args.speedup,
            count=args.requests,
            fmt=args.trace_format,
            models=parse_model_map(args.trace_model),
        )
    else:
        duration = args.duration if args.duration is not None else (None if args.requests else 30.0)
        plan = list(
            poisson_plan(
                args.rate,
                LengthDistribution.parse(args.input_len),
                LengthDistribution.parse(args.output_len),
                random.Random(args.seed),
                duration=duration,
                count=args.requests,
            )
        )
    return plan, len(plan)


def settings_from_args(args: argparse.Namespace) -> LoadSettings:
    """Where and how to send, from the flags."""
    headers = {}
    for item in args.header:
        key, sep, value = item.partition(":")
        if not sep or not key.strip():
            raise ConfigError(f"--header wants K:V, got {item!r}")
        headers[key.strip()] = value.strip()
    return LoadSettings(
        url=args.url,
        model=args.model,
        endpoint=args.endpoint,
        stream=not args.no_stream,
        api_key=args.api_key,
        headers=headers,
        timeout=args.timeout,
        ignore_eos=args.ignore_eos,
        distinct_prompts=args.distinct_prompts,
    )


def executed_trace(executed: Iterable[tuple[PlannedRequest, Outcome]], model: str) -> list[TraceRecord]:
    """What a run actually sent, in the trace schema, in sending order.

    The timestamp is when a request left (seconds from the run's start), the lengths are the server's counts
    where it reported them (else the planned prompt, and no output for a failed request), `max_tokens` is the
    planned output, and the latencies are the measured ones.
    """
    return [
        TraceRecord(
            timestamp=o.sent_at,
            model=model,
            input_tokens=o.input_tokens,
            output_tokens=o.output_tokens if o.ok else 0,
            max_tokens=p.output_tokens,
            e2e_s=o.e2e,
            ttft_s=o.ttft,
        )
        for p, o in sorted(executed, key=lambda e: e[1].sent_at)
    ]


async def load_report(args: argparse.Namespace) -> dict[str, Any]:
    """Run the load the flags describe and build its report (and, with --record, the trace it executed)."""
    plan, total = plan_from_args(args)
    settings = settings_from_args(args)
    if args.record:
        write_trace([], args.record)  # a bad name or an unwritable place fails now, not after the run
    executed: list[tuple[PlannedRequest, Outcome]] = []
    outcomes, elapsed = await run_load(
        plan, settings, total=total, progress=not args.no_progress, executed=executed
    )
    if args.record:
        write_trace(executed_trace(executed, settings.model), args.record)
    recorded = {k: v for k, v in vars(args).items() if k not in ("api_key", "cmd", "bench_cmd")}
    recorded["loadavg"] = list(os.getloadavg())
    return build_report(outcomes, elapsed, recorded)


def run_from_args(args: argparse.Namespace) -> int:
    """`otela bench load`: print the JSON report (and write it to --out); exit status 1 if any request failed."""
    try:
        import uvloop

        report = uvloop.run(load_report(args))
    except ImportError:
        report = asyncio.run(load_report(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if report["failed"] == 0 else 1
