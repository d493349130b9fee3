"""What a serving engine runs with, for the node's record: its command line, its model file, its own answers.

Read once, when the engine starts serving. The adapter (`opentela.engines`) parses; this module does the I/O:
a GET of each of the adapter's `report_paths` on the engine (bounded), and a read of a GGUF file's header off the
event loop. The command line wins over the model file, which wins over what the engine answers; where the command
line and the engine disagree, the node says so once in its log and publishes the command line's value.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from opentela.engines._registry import engine_adapter
from opentela.engines.advertised import ADVERTISED_KEYS, merge_settings
from opentela.engines.base import Engine, EngineSpec, advertised_settings
from opentela.engines.gguf_info import gguf_settings
from opentela.errors import ConfigError

logger = logging.getLogger(__name__)

REPORT_TIMEOUT_S = 3.0
"""Each report GET's limit; they run together, so the engine's announcement waits at most about this long."""
MAX_REPORT_BYTES = 4 << 20


async def fetch_reports(
    base_url: str, paths: Sequence[str], timeout: float = REPORT_TIMEOUT_S
) -> dict[str, Any]:
    """The parsed JSON answers of the engine's report `paths`; a path that fails, times out or is not JSON is
    missing."""
    if not paths:
        return {}

    async def one(http: aiohttp.ClientSession, path: str) -> Any:
        try:
            async with http.get(base_url + path) as resp:
                if resp.status != 200:
                    return None
                body = await resp.content.read(MAX_REPORT_BYTES + 1)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        if len(body) > MAX_REPORT_BYTES:
            return None
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            return None

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
        answers = await asyncio.gather(*(one(http, p) for p in paths))
    return {p: a for p, a in zip(paths, answers, strict=True) if a is not None}


def _adapter(name: str) -> Engine | None:
    try:
        return engine_adapter(name)
    except ConfigError:
        return None  # a spec no adapter produced (tests, plugins gone since)


async def engine_settings(spec: EngineSpec, served: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The settings the node publishes for every model of this engine, beyond each /v1/models entry's own.

    `served` is the engine's /v1/models list; its first entry's settings join the engine's report when looking
    for disagreements with the command line. Never raises: an adapter that fails only advertises less.
    """
    adapter = _adapter(spec.name)
    if adapter is None:
        return {}
    try:
        reports = await fetch_reports(spec.base_url, adapter.report_paths)
        launched = adapter.launch_settings(spec.argv)
        path = adapter.model_file(spec.argv, reports)
        if path:
            launched = {**await asyncio.to_thread(gguf_settings, path), **launched}
        reported = adapter.reported_settings(reports)
    except Exception:  # an adapter is plugin code: never let it take the node down
        logger.warning("engine %s: cannot read its settings", spec.name, exc_info=True)
        return {}
    listed = advertised_settings(served[0]) if served else {}
    listed = {k: v for k, v in listed.items() if k in ADVERTISED_KEYS}
    merged, mismatches = merge_settings(launched, {**listed, **reported})
    for key, ours, theirs in mismatches:
        logger.warning(
            "engine %s: the command line says %s=%s but the engine reports %s; advertising %s",
            spec.name,
            key,
            ours,
            theirs,
            ours,
        )
    return merged
