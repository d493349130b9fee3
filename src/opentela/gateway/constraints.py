"""QoS constraints: node properties a request requires (``gpu=H100,quantization>=8bit,context>=32768``)."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentela.engines.advertised import (
    DATA_PARALLEL,
    DTYPE,
    PIPELINE_PARALLEL,
    TENSOR_PARALLEL,
    TOOL_CALLS,
    normalise_dtype,
    normalise_quantization,
)
from opentela.errors import InvalidRequestError
from opentela.registry.record import ModelEntry, NodeRecord

REQUIRE_HEADER = "X-Otela-Require"

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "!=": operator.ne,
    "==": operator.eq,
    "=": operator.eq,
    ">": operator.gt,
    "<": operator.lt,
}
_TERM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*(>=|<=|!=|==|=|>|<)\s*(\S(?:.*\S)?)\s*$")
_STRING_KEYS = frozenset({"gpu", "engine", "provider", "dtype"})
_NUMBER_KEYS = frozenset({"context", "gpus", "gpu_memory", "tp", "pp", "dp"})
_ALIASES = {"tp": TENSOR_PARALLEL, "pp": PIPELINE_PARALLEL, "dp": DATA_PARALLEL}
"""Short constraint names for settings; ``tp`` also reads the tensor-parallel engine's ``tp_degree``."""
_QUANT_BITS = {
    "fp32": 32, "float32": 32, "none": 16, "fp16": 16, "float16": 16, "bf16": 16, "bfloat16": 16, "half": 16,
    "fp8": 8, "int8": 8, "w8a8": 8, "q8_0": 8, "awq": 4, "gptq": 4, "int4": 4, "fp4": 4, "nf4": 4, "q4_0": 4,
    "q4_1": 4, "q4_k_m": 4, "q5_k_m": 5, "q6_k": 6, "q3_k_m": 3, "q2_k": 2,
}  # fmt: skip
_BITS = re.compile(r"\d+(?:\.\d+)?\s*(?:-?bits?)?")
_GGUF_BITS = re.compile(r"^i?q(\d)_")  # llama.cpp's names: q5_k_s, iq4_xs, q8_0 (digits are bits per weight)
_VERSION = re.compile(r"\d{1,18}(?:\.\d{1,18})*")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?[bB])?$")


def quantization_bits(value: Any) -> float | None:
    """Bits per weight of a quantization name or ``8bit``/``8``; absent or ``none`` means 16 (unquantized)."""
    if value is None or value == "":
        return 16.0
    text = str(value).strip().lower()
    if text in _QUANT_BITS:
        return float(_QUANT_BITS[text])
    named = normalise_quantization(text)
    if named in _QUANT_BITS:
        return float(_QUANT_BITS[named])
    gguf = _GGUF_BITS.match(named or "")
    if gguf:
        return float(gguf.group(1))
    match = _BITS.fullmatch(text)
    return float(re.match(r"\d+(?:\.\d+)?", text).group()) if match else None  # type: ignore[union-attr]


def _amount(value: Any, byte_units: bool = False) -> float | None:
    """A number with an optional k/M/G/T suffix: powers of 1024 (``32k`` contexts, ``80GiB``), except that
    with `byte_units` a plain ``GB`` is decimal, as GPU memory is sold (an "80 GB" H100 has 79.6 GiB)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    match = _SIZE.match(str(value).strip())
    if not match:
        return None
    power = " KMGT".index(match.group(2).upper() or " ")
    binary = not byte_units or (match.group(3) or "").lower() == "ib"
    return float(match.group(1)) * float((1024 if binary else 1000) ** power)


@dataclass(frozen=True, slots=True)
class Constraint:
    """One ``key op value`` requirement."""

    key: str
    op: str
    value: str

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value}"

    def observed(self, record: NodeRecord, entry: ModelEntry | None) -> Any:
        """The value of this property on a replica (None when it does not say)."""
        settings: Mapping[str, Any] = entry.settings if entry is not None else {}
        key = self.key
        if key == "gpu":
            # A setting is any scalar the schema allows (a member may write `gpu: 1`): compare its text.
            names = [str(settings["gpu"])] if settings.get("gpu") else []
            names += [
                str(g.get("name", "")) for g in record.hardware.get("gpus") or () if isinstance(g, Mapping)
            ]
            return names or ["cpu"]
        if key == "gpus":
            return len(record.hardware.get("gpus") or ())
        if key == "gpu_memory":
            mib = [
                g.get("memory_mib") or 0 for g in record.hardware.get("gpus") or () if isinstance(g, Mapping)
            ]
            return max(mib) * 2**20 if mib else 0
        if key == "engine":
            return entry.engine if entry is not None else None
        if key == "provider":
            return record.provider_id
        if key == "quantization":
            return settings.get("quantization")
        if key in _ALIASES:
            return settings.get(_ALIASES[key], settings.get("tp_degree") if key == "tp" else None)
        if key == "context":
            return settings.get("context_length", settings.get("max_model_len"))
        if key in settings:
            return settings[key]
        return record.hardware.get(key)

    def holds(self, record: NodeRecord, entry: ModelEntry | None) -> bool:
        """Whether the replica satisfies this constraint; a property it does not advertise never does."""
        seen = self.observed(record, entry)
        compare = _OPS[self.op]
        if self.key == "gpu":
            wanted = _squash(self.value)
            hit = any(wanted in _squash(name) for name in seen)
            return hit if self.op in ("=", "==") else not hit
        if self.key == "quantization":
            have, want = quantization_bits(seen), quantization_bits(self.value)
            if self.op in ("=", "==", "!=") and not _BITS.fullmatch(self.value.strip().lower()):
                # A method named exactly (awq, q4_1): compare normalised names (Q4_1, awq_marlin); `=8bit`
                # compares precision.
                return compare(_quant_name(seen), _quant_name(self.value))
            return have is not None and want is not None and compare(have, want)
        if seen is None:
            return False
        if self.key == DTYPE:
            return compare(normalise_dtype(str(seen)) or str(seen).lower(), normalise_dtype(self.value))
        if self.key == "engine_version" and self.op not in ("=", "==", "!="):
            have_v, want_v = _version(seen), _version(self.value)
            return have_v is not None and want_v is not None and compare(have_v, want_v)
        if self.key not in _STRING_KEYS:
            memory = self.key == "gpu_memory"
            have_n, want_n = _amount(seen), _amount(self.value, byte_units=memory)
            if have_n is not None and want_n is not None:
                if memory and not _SIZE.match(self.value.strip()).group(2):  # type: ignore[union-attr]
                    want_n *= 1e9  # a bare number of GPU memory means GB
                return compare(have_n, want_n)
        if self.op not in ("=", "==", "!="):
            return False
        return compare(str(seen).lower(), self.value.lower())


def _quant_name(value: Any) -> str:
    """A quantization as one name: unquantized (absent, ``none``, ``fp16``...) is ``none``."""
    if value is None:
        return "none"
    return normalise_quantization(str(value)) or (
        "none" if quantization_bits(value) == 16 else str(value).lower()
    )


def _version(value: Any) -> tuple[int, ...] | None:
    """The leading dotted number of a version (``0.8.5rc1`` -> (0, 8, 5); ``b4567-1a2b`` -> (4567,))."""
    match = _VERSION.search(str(value))
    return tuple(int(p) for p in match.group().split(".")[:8]) if match else None


def _squash(text: str) -> str:
    return re.sub(r"[\s_-]", "", text).lower()


def parse_constraints(text: Any, where: str = REQUIRE_HEADER) -> tuple[Constraint, ...]:
    """Parse ``key op value`` terms separated by commas; InvalidRequestError (400) on anything malformed."""
    if text is None:
        return ()
    if not isinstance(text, str):
        raise InvalidRequestError(f"{where} must be a string like gpu=H100,context>=32768", param=where)
    out = []
    for term in text.split(","):
        if not term.strip():
            continue
        match = _TERM.match(term)
        if not match:
            raise InvalidRequestError(
                f"cannot read constraint {term.strip()!r} in {where}; write key=value, key>=value, ...",
                param=where,
            )
        key, op, value = match.group(1).lower(), match.group(2), match.group(3)
        if key in _STRING_KEYS and op not in ("=", "==", "!="):
            raise InvalidRequestError(f"constraint {term.strip()!r}: {key} can only be compared with = or !=")
        if key in _NUMBER_KEYS and _amount(value) is None:
            raise InvalidRequestError(f"constraint {term.strip()!r}: {key} needs a number")
        if key == "quantization" and op not in ("=", "==", "!=") and quantization_bits(value) is None:
            raise InvalidRequestError(
                f"constraint {term.strip()!r}: write the precision as e.g. 8bit or fp16"
            )
        out.append(Constraint(key, op, value))
    return tuple(out)


def model_entry(record: NodeRecord, model: str) -> ModelEntry | None:
    """The record's entry for `model`."""
    for entry in record.models:
        if entry.id == model:
            return entry
    return None


def tool_takers(candidates: Sequence[NodeRecord], model: str) -> list[NodeRecord]:
    """The replicas of `model` that may get a request with `tools`: all but those whose engine says it ignores
    them (an engine that does not say is trusted to handle them)."""
    out = []
    for record in candidates:
        entry = model_entry(record, model)
        if entry is None or entry.settings.get(TOOL_CALLS) is not False:
            out.append(record)
    return out


def require_tool_takers(candidates: Sequence[NodeRecord], model: str) -> list[NodeRecord]:
    """`tool_takers`, or a 400 naming `tools` when there are none: the engines would ignore them."""
    pool = tool_takers(candidates, model)
    if not pool:
        raise InvalidRequestError(
            f"model {model!r} does not support tool calls: its engines report that its chat template has no "
            "tool support, so `tools` would be ignored; send the request without them or use another model",
            param="tools",
        )
    return pool


def wants_tools(body: Mapping[str, Any]) -> bool:
    """Whether a chat body asks for tool calls: tools given and `tool_choice` not "none"."""
    return bool(body.get("tools")) and body.get("tool_choice") != "none"


def satisfying(
    candidates: Sequence[NodeRecord], model: str, constraints: Sequence[Constraint]
) -> tuple[list[NodeRecord], Constraint | None]:
    """The candidates meeting every constraint, and when none does, the constraint that ruled the last out."""
    if not constraints:
        return list(candidates), None
    pool = list(candidates)
    for constraint in constraints:
        kept = [c for c in pool if constraint.holds(c, model_entry(c, model))]
        if not kept:
            return [], constraint
        pool = kept
    return pool, None


def describe_observed(candidates: Sequence[NodeRecord], model: str, constraint: Constraint) -> str:
    """What the replicas offer for the constrained property, for the error message."""
    seen: set[str] = set()
    for c in candidates:
        value = constraint.observed(c, model_entry(c, model))
        if isinstance(value, list):
            seen.update(value)
        elif constraint.key == "quantization":
            seen.add(_quant_name(value))  # what the constraint compares: not saying is unquantized
        else:
            seen.add("unknown" if value is None else str(value))
    return ", ".join(sorted(seen)[:8])
