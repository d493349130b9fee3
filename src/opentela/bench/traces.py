"""One trace schema for every workload tool: a request's time, model, token counts and what else is known of it.

`otela simulate`, `otela plan`, `otela bench load`, `otela trace analyze` and the controller all read traces as
`TraceRecord`s; the frontend's export writes them. Field definitions are in docs/traces.md. This module holds the
schema and our own CSV and JSON-lines encoding; `trace_formats` reads the public traces' formats.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from opentela.errors import ConfigError

PREFIX_BLOCK_TOKENS = 16
"""Tokens per prefix-hash block (the Mooncake trace's method: chained hashes of fixed-size token blocks)."""


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One request of a trace."""

    timestamp: float
    """Arrival, in seconds: Unix time, or seconds from the trace's start when the source gives only that."""
    model: str
    input_tokens: int
    output_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    """The output cap the request asked for, if it named one."""
    e2e_s: float | None = None
    """End-to-end latency, seconds, where known."""
    ttft_s: float | None = None
    """Time to first token, seconds, where known."""
    reasoning: bool | None = None
    """Whether the model reasons (thinks before answering); None: unknown."""
    prefix_hashes: tuple[str, ...] = ()
    """Chained, salted hashes of the prompt's 16-token blocks, hex; equal leading hashes mean a shared prefix."""
    session: str | None = None
    """A conversation or client id that groups requests, where the source has one (never a user's identity)."""

    def __post_init__(self) -> None:
        if self.input_tokens < 0 or self.output_tokens < 0:
            raise ValueError(f"token counts must be >= 0, not {self.input_tokens}/{self.output_tokens}")
        if not self.model:
            raise ValueError("a trace record needs a model")


CSV_COLUMNS = tuple(f.name for f in dataclasses.fields(TraceRecord))
"""The columns `write_trace` writes to CSV, in this order (the schema's fields)."""

TRACE_FORMATS = ("auto", "opentela", "frontend", "burstgpt", "azure", "mooncake", "legacy")
"""What `read_trace(fmt=...)` accepts; `legacy` is the scheduler's old ``arrival,input,output[,model]``."""

UNKNOWN_MODEL = "unknown"
"""The model of records whose source names none, unless the caller gives one."""


# --- field parsing: each raises ValueError saying what is wrong; the readers add the file and line --------------
def opt_float(value: Any, name: str) -> float | None:
    """A finite float, or None for an empty cell or a JSON null."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, not {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, not {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, not {value!r}")
    return number


def req_float(value: Any, name: str) -> float:
    """A finite float that must be there."""
    number = opt_float(value, name)
    if number is None:
        raise ValueError(f"{name} is missing")
    return number


def opt_int(value: Any, name: str) -> int | None:
    """A whole number (``12`` or ``12.0``), or None for an empty cell or a JSON null."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())  # digits straight from the text stay exact past 2**53
        except ValueError:
            pass
    number = opt_float(value, name)
    if number is None:
        return None
    if not number.is_integer():
        raise ValueError(f"{name} must be a whole number, not {value!r}")
    return int(number)


def req_int(value: Any, name: str) -> int:
    """A whole number that must be there."""
    number = opt_int(value, name)
    if number is None:
        raise ValueError(f"{name} is missing")
    return number


def opt_bool(value: Any, name: str) -> bool | None:
    """true/false (also 1/0, yes/no), or None for an empty cell or a JSON null."""
    if value is None or value == "" or isinstance(value, bool):
        return value if isinstance(value, bool) else None
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"{name} must be true or false, not {value!r}")


def sampling_values(params: Mapping[str, Any]) -> dict[str, Any]:
    """temperature, top_p and max_tokens (or max_completion_tokens) of a request's sampling parameters."""

    def number(key: str) -> float | None:
        v = params.get(key)
        return (
            float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None
        )

    cap = params.get("max_tokens", params.get("max_completion_tokens"))
    return {
        "temperature": number("temperature"),
        "top_p": number("top_p"),
        "max_tokens": cap if isinstance(cap, int) and not isinstance(cap, bool) else None,
    }


# --- our own encoding ------------------------------------------------------------------------------------------
def csv_row(record: TraceRecord) -> list[str]:
    """The record as CSV cells in `CSV_COLUMNS` order: empty for unknowns, prefix hashes space-separated."""
    for h in record.prefix_hashes:
        if not h or h != h.strip() or len(h.split()) != 1:
            raise ValueError(f"a prefix hash cannot be empty or hold whitespace: {h!r}")
    cells: list[str] = []
    for name in CSV_COLUMNS:
        value = getattr(record, name)
        if value is None:
            cells.append("")
        elif isinstance(value, bool):
            cells.append("true" if value else "false")
        elif isinstance(value, tuple):
            cells.append(" ".join(value))
        else:
            cells.append(repr(value) if isinstance(value, float) else str(value))
    return cells


def json_object(record: TraceRecord) -> dict[str, Any]:
    """The record as one JSON-lines object; unknown fields are left out."""
    out: dict[str, Any] = {}
    for name in CSV_COLUMNS:
        value = getattr(record, name)
        if value is None or value == ():
            continue
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def record_from_row(row: Mapping[str, Any], default_model: str) -> TraceRecord:
    """A record from our CSV cells or JSON object (JSON keys of the old load-generator traces accepted too)."""
    timestamp = row.get("timestamp", row.get("time"))
    inp = next((row[k] for k in ("input_tokens", "prompt_tokens", "input_len") if k in row), None)
    out = next((row[k] for k in ("output_tokens", "completion_tokens", "output_len") if k in row), None)
    hashes = row.get("prefix_hashes") or ()
    if isinstance(hashes, str):
        hashes = hashes.split()
    if not isinstance(hashes, list | tuple) or not all(isinstance(h, str) and h for h in hashes):
        raise ValueError(f"prefix_hashes must be a list of hex strings, not {hashes!r}")
    session = row.get("session")
    if session is not None and not isinstance(session, str):
        session = str(session)
    model = row.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"model must be a string, not {model!r}")
    return TraceRecord(
        timestamp=req_float(timestamp, "timestamp"),
        model=model or default_model,
        input_tokens=req_int(inp, "input_tokens"),
        output_tokens=req_int(out, "output_tokens"),
        temperature=opt_float(row.get("temperature"), "temperature"),
        top_p=opt_float(row.get("top_p"), "top_p"),
        max_tokens=opt_int(row.get("max_tokens"), "max_tokens"),
        e2e_s=opt_float(row.get("e2e_s"), "e2e_s"),
        ttft_s=opt_float(row.get("ttft_s"), "ttft_s"),
        reasoning=opt_bool(row.get("reasoning"), "reasoning"),
        prefix_hashes=tuple(hashes),
        session=session or None,
    )


def open_text(path: Path, *, write: bool = False) -> IO[str]:
    """A trace file as text (gzip-compressed when it ends in .gz); ``newline=""`` as the csv module wants."""
    # utf-8-sig drops the byte-order mark some spreadsheet exports start with.
    encoding = "utf-8" if write else "utf-8-sig"
    if path.suffix == ".gz":
        return gzip.open(path, "wt" if write else "rt", encoding=encoding, newline="")
    return path.open("w" if write else "r", encoding=encoding, newline="")


def write_trace(records: Iterable[TraceRecord], path: str | Path) -> int:
    """Write records as CSV (``.csv``) or JSON lines (``.jsonl``), optionally ``.gz``; returns how many."""
    path = Path(path)
    suffix = path.with_suffix("").suffix if path.suffix == ".gz" else path.suffix
    if suffix not in (".csv", ".jsonl", ".json", ".ndjson"):
        raise ConfigError(f"cannot tell the trace format of {path}: name it .csv or .jsonl")
    count = 0
    try:
        with open_text(path, write=True) as f:
            if suffix == ".csv":
                writer = csv.writer(f, lineterminator="\n")
                writer.writerow(CSV_COLUMNS)
                for record in records:
                    writer.writerow(csv_row(record))
                    count += 1
            else:
                for record in records:
                    f.write(json.dumps(json_object(record), allow_nan=False) + "\n")
                    count += 1
    except OSError as exc:
        raise ConfigError(f"cannot write trace {path}: {exc}") from None
    return count


def read_trace(path: str | Path, fmt: str = "auto", *, model: str | None = None) -> list[TraceRecord]:
    """The requests of a trace file, sorted by timestamp; `fmt` forces one of `TRACE_FORMATS`.

    `model` names the records of sources without a model column (Azure, Mooncake, model-less JSON lines).
    """
    # The readers build TraceRecords, so they import this module; importing them here avoids the cycle.
    from opentela.bench.trace_formats import read_records

    return read_records(Path(path), fmt, model)


def select_models(records: Sequence[TraceRecord], names: Mapping[str, str]) -> list[TraceRecord]:
    """The records of the models `names` lists, renamed to its values; all of them when `names` is empty."""
    if not names:
        return list(records)
    return [dataclasses.replace(r, model=names[r.model]) for r in records if r.model in names]


def parse_model_map(items: Sequence[str]) -> dict[str, str]:
    """``NAME`` or ``NAME=AS`` flags as {trace model: model to use}; ConfigError on an empty side."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, alias = item.partition("=")
        name, alias = name.strip(), alias.strip() if sep else name.strip()
        if not name or not alias:
            raise ConfigError(f"expected NAME or NAME=MODEL, got {item!r}")
        out[name] = alias
    return out
