"""Trace readers: our own CSV and JSON lines, the frontend's earlier export, BurstGPT, Azure and Mooncake traces.

Each source format is one row function (a CSV row as {column: cell}, or a JSON object, to a `TraceRecord`); one
driver finds the format from the first line, reads the rows and turns any bad one into a ConfigError that names
the file, the line and what is wrong. The mapping of each format is documented in docs/traces.md.
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opentela.bench.traces import (
    TRACE_FORMATS,
    UNKNOWN_MODEL,
    TraceRecord,
    open_text,
    record_from_row,
    req_float,
    req_int,
    sampling_values,
)
from opentela.errors import ConfigError

RowReader = Callable[[Mapping[str, Any], str], TraceRecord]


@dataclass(frozen=True)
class _Source:
    """One source format: how its rows are written, which columns it needs, how a row becomes a record."""

    name: str
    syntax: frozenset[str]
    """``csv``, ``json`` or both."""
    needs: tuple[str, ...]
    """CSV columns without which the file is not this format."""
    row: RowReader
    default_model: str


def _when(value: Any) -> float:
    """Seconds from a number, or Unix seconds from an ISO date and time (UTC unless it names a zone)."""
    text = str(value).strip()
    try:
        return req_float(text, "timestamp")
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"timestamp must be seconds or an ISO date and time, not {value!r}") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _model(value: Any, default: str) -> str:
    return str(value).strip() if value is not None and str(value).strip() else default


def _frontend(row: Mapping[str, Any], model: str) -> TraceRecord:
    """The frontend's export before it wrote this schema: ISO time, model, tokens, sampling parameters as JSON."""
    raw = row.get("sampling_params") or "{}"
    try:
        sampling = json.loads(raw)
    except ValueError:
        raise ValueError(f"sampling_params is not JSON: {raw!r}") from None
    if not isinstance(sampling, dict):
        raise ValueError(f"sampling_params must be a JSON object, not {raw!r}")
    return TraceRecord(
        _when(row.get("timestamp")),
        _model(row.get("model"), model),
        req_int(row.get("input_tokens"), "input_tokens"),
        req_int(row.get("output_tokens"), "output_tokens"),
        **sampling_values(sampling),
    )


def _burstgpt(row: Mapping[str, Any], model: str) -> TraceRecord:
    """BurstGPT: seconds from the trace's start, the model, request and response tokens."""
    return TraceRecord(
        req_float(row.get("Timestamp"), "Timestamp"),
        _model(row.get("Model"), model),
        req_int(row.get("Request tokens"), "Request tokens"),
        req_int(row.get("Response tokens"), "Response tokens"),
    )


def _azure(row: Mapping[str, Any], model: str) -> TraceRecord:
    """Azure LLM inference traces: a date and time, context and generated tokens; no model."""
    return TraceRecord(
        _when(row.get("TIMESTAMP")),
        model,
        req_int(row.get("ContextTokens"), "ContextTokens"),
        req_int(row.get("GeneratedTokens"), "GeneratedTokens"),
    )


def _mooncake(row: Mapping[str, Any], model: str) -> TraceRecord:
    """Mooncake: milliseconds, input and output lengths, and the ids of the prompt's hashed blocks."""
    ids = row.get("hash_ids") or []
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
    ):
        raise ValueError(f"hash_ids must be a list of non-negative integers, not {ids!r}")
    return TraceRecord(
        req_float(row.get("timestamp"), "timestamp") / 1000.0,
        model,
        req_int(row.get("input_length"), "input_length"),
        req_int(row.get("output_length"), "output_length"),
        prefix_hashes=tuple(format(i, "x") for i in ids),
    )


def _legacy(row: Mapping[str, Any], model: str) -> TraceRecord:
    """The scheduler's old trace: arrival seconds, input and output tokens, an optional model index."""
    index = row.get("model")
    return TraceRecord(
        req_float(row.get("arrival"), "arrival"),
        str(req_int(index, "model")) if index not in (None, "") else model,
        req_int(row.get("input"), "input"),
        req_int(row.get("output"), "output"),
    )


_CSV, _JSON = frozenset({"csv"}), frozenset({"json"})
SOURCES: dict[str, _Source] = {
    s.name: s
    for s in (
        _Source(
            "opentela",
            _CSV | _JSON,
            ("timestamp", "input_tokens", "output_tokens"),
            record_from_row,
            UNKNOWN_MODEL,
        ),
        _Source(
            "frontend",
            _CSV,
            ("timestamp", "model", "input_tokens", "output_tokens", "sampling_params"),
            _frontend,
            UNKNOWN_MODEL,
        ),
        _Source(
            "burstgpt",
            _CSV,
            ("Timestamp", "Model", "Request tokens", "Response tokens"),
            _burstgpt,
            "burstgpt",
        ),
        _Source("azure", _CSV, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), _azure, "azure"),
        _Source("mooncake", _JSON, (), _mooncake, "mooncake"),
        _Source("legacy", _CSV | _JSON, ("arrival", "input", "output"), _legacy, "0"),
    )
}


def _csv_source(header: list[str]) -> _Source | None:
    """The format a CSV header announces; the frontend's old export is ours plus sampling_params."""
    columns = set(header)
    if "sampling_params" in columns:
        return SOURCES["frontend"]
    for name in ("opentela", "burstgpt", "azure"):
        if set(SOURCES[name].needs) <= columns:
            return SOURCES[name]
    return SOURCES["legacy"] if "arrival" in columns else None


def _json_source(row: Mapping[str, Any]) -> _Source:
    """The format a first JSON object announces (ours, the old load-generator lines among them, by default)."""
    if "arrival" in row:
        return SOURCES["legacy"]
    if "input_length" in row or "hash_ids" in row:
        return SOURCES["mooncake"]
    return SOURCES["opentela"]


def _build(source: _Source, row: Mapping[str, Any], model: str | None, where: str) -> TraceRecord:
    try:
        return source.row(row, model or source.default_model)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: {exc} ({source.name} trace)") from None


def _read_json(
    lines: Iterable[str], first: int, path: Path, forced: _Source | None, model: str | None
) -> Iterator[TraceRecord]:
    source = forced
    for number, line in enumerate(lines, first):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{path}:{number}: not a JSON object ({exc})") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{number}: expected a JSON object, found {type(row).__name__}")
        source = source or _json_source(row)
        yield _build(source, row, model, f"{path}:{number}")


def _read_csv(
    lines: Iterable[str], first: int, path: Path, forced: _Source | None, model: str | None
) -> Iterator[TraceRecord]:
    reader = csv.reader(lines)
    try:
        header = [h.strip() for h in next(reader)]
        source = forced or _csv_source(header)
        if source is None:
            known = "; ".join(f"{s.name}: {','.join(s.needs)}" for s in SOURCES.values() if s.needs)
            raise ConfigError(f"{path}:{first}: unknown trace header {','.join(header)!r} (known: {known})")
        missing = [c for c in source.needs if c not in header]
        if missing:
            raise ConfigError(
                f"{path}:{first}: not in the {source.name} format: each row needs {', '.join(source.needs)}; "
                f"the header lacks {', '.join(missing)}"
            )
        for cells in reader:
            number = first - 1 + reader.line_num
            if not any(c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise ConfigError(f"{path}:{number}: {len(cells)} cells where the header has {len(header)}")
            yield _build(source, dict(zip(header, cells, strict=True)), model, f"{path}:{number}")
    except csv.Error as exc:
        raise ConfigError(f"{path}:{first - 1 + reader.line_num}: unreadable CSV ({exc})") from None


def read_records(path: Path, fmt: str, model: str | None) -> list[TraceRecord]:
    """`read_trace`'s work: detect or force the format, read every row, sort by timestamp."""
    if fmt not in TRACE_FORMATS:
        raise ConfigError(f"unknown trace format {fmt!r}: use one of {', '.join(TRACE_FORMATS)}")
    forced = None if fmt == "auto" else SOURCES[fmt]
    try:
        with open_text(path) as f:
            blank = 0
            for line in f:
                if line.strip():
                    break
                blank += 1
            else:
                return []
            rest = itertools.chain([line], f)
            is_json = line.lstrip().startswith(("{", "["))
            if forced is not None and ("json" if is_json else "csv") not in forced.syntax:
                given, wanted = ("JSON lines", "CSV") if is_json else ("CSV", "JSON lines")
                raise ConfigError(
                    f"{path}:{blank + 1}: the {fmt} format is {wanted}, but this file is {given}"
                )
            read = _read_json if is_json else _read_csv
            records = list(read(rest, blank + 1, path, forced, model))
    except OSError as exc:
        raise ConfigError(f"cannot read trace {path}: {exc}") from None
    except (UnicodeDecodeError, EOFError) as exc:
        raise ConfigError(f"cannot read trace {path}: not UTF-8 text or a truncated file ({exc})") from None
    records.sort(key=lambda r: r.timestamp)
    return records
