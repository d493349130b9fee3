"""Records at the door: anything a member can send either fails validation or renders through every view.

The strategy builds records shaped like honest ones with any field (or any nested part of `hardware` and
`settings`) replaced by hostile values: wrong types, NaN, infinities, huge numbers and strings.
"""

from __future__ import annotations

import io
import json
import math
import time
from types import SimpleNamespace
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from opentela._types import Lifecycle
from opentela.cli.status import hardware_text, status_table
from opentela.engines.advertised import ADVERTISED_KEYS, clean_settings
from opentela.engines.base import advertised_settings
from opentela.fabric.identity import Identity
from opentela.gateway.constraints import describe_observed, parse_constraints, satisfying
from opentela.gateway.policies.weights import replica_weight
from opentela.gateway.routes.infra import _hardware_summary, _replica
from opentela.registry.record import MAX_RECORD_BYTES, MAX_SETTINGS, ModelEntry, NodeRecord

OWNER = Identity.generate()
NOW = time.time()

hostile = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e15, 1e308, 2**63 - 1, 2**63, -1]),
    st.text(max_size=20),
    st.just("x" * 5000),
    st.binary(max_size=10),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)
name_or_hostile = st.one_of(st.sampled_from(["NVIDIA H100", "A100", "", "cpu"]), hostile)
int_or_hostile = st.one_of(st.integers(0, 2**20), hostile)

gpu = (
    st.fixed_dictionaries(
        {},
        optional={
            "index": int_or_hostile,
            "name": name_or_hostile,
            "memory_mib": int_or_hostile,
            "uuid": hostile,
        },
    )
    | hostile
)
cpu = (
    st.fixed_dictionaries(
        {},
        optional={
            "model": name_or_hostile,
            "arch": name_or_hostile,
            "cores": int_or_hostile,
            "threads": int_or_hostile,
            "usable": int_or_hostile,
            "flags": st.lists(st.sampled_from(["avx2", "avx512f"]), max_size=2) | hostile,
        },
    )
    | hostile
)
hardware = st.fixed_dictionaries(
    {},
    optional={
        "gpus": st.lists(gpu, max_size=3) | hostile,
        "gpu_source": st.sampled_from(["nvml", None]) | hostile,
        "cpu": cpu,
        "ram_mib": int_or_hostile,
        "os": name_or_hostile,
        "hostname": name_or_hostile,
        "extra": hostile,
    },
)
setting_values = st.one_of(
    st.integers(1, 2**17), st.sampled_from(["q4", "fp16", "H100"]), st.floats(0, 1e4), hostile
)
model_settings = st.dictionaries(
    st.sampled_from(["context_length", "gpu", "quantization", "throughput", "weight", "simulated"])
    | st.sampled_from(["dtype", "tensor_parallel_size", "pipeline_parallel_size", "engine_version"])
    | st.text(max_size=8),
    setting_values,
    max_size=5,
)
timestamp = st.one_of(st.floats(0, NOW + 10), hostile)
# Text a member chooses freely: console markup, HTML, control characters.
member_text = st.sampled_from(["lab", "[/]", "[bold]x", "<b>", "\x1b[31m", ""]) | st.text(max_size=20)


@st.composite
def wire_records(draw: st.DrawFn) -> dict[str, Any]:
    """A record's wire form signed by a member: valid in shape, with hostile parts."""
    lifecycle = draw(st.sampled_from([Lifecycle.JOIN, Lifecycle.SERVING, Lifecycle.DOWN]))
    record = NodeRecord(
        session_id="s-1",
        peer_id=OWNER.peer_id,
        provider_id=draw(member_text),
        lifecycle=lifecycle,
        version=draw(st.integers(0, 2**64)),
        addrs=(draw(member_text),),
        roles=(draw(member_text),),
        reason=draw(member_text),
        hardware=draw(hardware),
        models=(ModelEntry("m", draw(member_text), draw(model_settings)),),
        started_at=draw(timestamp),
        updated_at=draw(timestamp),
    )
    try:
        return record.signed(OWNER).to_wire()
    except (TypeError, ValueError, OverflowError):
        # msgpack cannot even encode it, so no peer could have sent it: send the unsigned form.
        return {**record.to_wire(), "signature": b"\0" * 64}


def _renders(value: Any) -> None:
    json.dumps(value, allow_nan=False)


@settings(max_examples=400, deadline=None)
@given(wire_records())
def test_every_record_that_passes_validation_renders_in_every_view(wire: dict[str, Any]) -> None:
    try:
        record = NodeRecord.from_wire(wire)
    except ValueError:
        return
    gw = SimpleNamespace(mesh=SimpleNamespace(is_suspected=lambda peer: False))
    _renders(record.to_json())
    _renders(_hardware_summary(record))
    _renders(_replica(gw, record, "m"))  # type: ignore[arg-type]
    _renders({"created": int(min([record.started_at]))})
    hardware_text(record.to_json()["hardware"])
    peers = [{"peer_id": record.peer_id, "suspected": True}]
    Console(file=io.StringIO(), width=160).print(status_table("mesh", [record.to_json()], peers))
    assert math.isfinite(replica_weight(record, "m"))
    for text in (
        *("gpu=H100", "gpu_memory>=1GiB", "context>=1024", "quantization<=8", "ram_mib>=1", "cpu=x"),
        *("quantization=q4_1", "dtype=bf16", "tp>=2", "pp=1", "engine_version>=0.8"),
    ):
        for constraint in parse_constraints(text):
            satisfying([record, record], "m", [constraint])
            describe_observed([record, record], "m", constraint)
    assert record.version < 2**53 and math.isfinite(record.updated_at)


EVICTOR = Identity.generate()


@settings(max_examples=300, deadline=None)
@given(wire_records())
def test_the_departure_and_eviction_of_every_valid_record_are_valid_tombstones(wire: dict[str, Any]) -> None:
    try:
        record = NodeRecord.from_wire(wire)
    except ValueError:
        return
    departure = record.tombstone().next(OWNER, lifecycle=Lifecycle.LEFT, updated_at=NOW)
    eviction = record.tombstone(version=record.version + 1, reason="suspected", updated_at=NOW).signed(
        EVICTOR
    )
    for left in (departure, eviction):
        back = NodeRecord.from_wire(left.to_wire())  # what every peer does with it
        assert back == left and back.verify()
        assert not (back.addrs or back.hardware or back.models)  # only what merge and GC need
        _renders(back.to_json())


@given(st.integers(MAX_RECORD_BYTES, 4 * MAX_RECORD_BYTES))
def test_records_over_the_size_limit_are_refused(size: int) -> None:
    record = NodeRecord(
        session_id="s-2",
        peer_id=OWNER.peer_id,
        provider_id="lab",
        lifecycle=Lifecycle.SERVING,
        version=1,
        models=tuple(ModelEntry(f"m{i}", "sim", {"pad": "x" * 200}) for i in range(size // 200)),
    ).signed(OWNER)
    try:
        NodeRecord.from_wire(record.to_wire())
    except ValueError as exc:
        assert "limit" in str(exc) or "models" in str(exc)
    else:
        raise AssertionError("an oversized record was accepted")


# --- what engines advertise ---------------------------------------------------------------------------------
# The advertised settings travel in each model entry's `settings` map, which a node of the previous release
# validates with the same rule as this one (short names of scalars, at most MAX_SETTINGS): no new record field, no
# version bump. These pin that: a new node's entries are plain settings, and an old node's entries still route.

raw_advertised = st.fixed_dictionaries(
    {},
    optional={
        "quantization": st.sampled_from(["Q4_1", "awq_marlin", "fp8", "none", "MOSTLY_Q8_0"]) | hostile,
        "dtype": st.sampled_from(["bfloat16", "half", "float32", "auto"]) | hostile,
        "tensor_parallel_size": st.integers(-2, 16) | st.sampled_from(["2", "8"]) | hostile,
        "pipeline_parallel_size": st.integers(-2, 16) | hostile,
        "data_parallel_size": st.integers(-2, 16) | hostile,
        "context_length": st.integers(-1, 2**32) | st.sampled_from(["32k", "128K"]) | hostile,
        "engine_version": st.sampled_from(["0.8.5", "b5009-5cbf13fc", "b0-unknown", "v0.4.6"]) | hostile,
    },
)
engine_extras = st.dictionaries(st.text(max_size=12), setting_values, max_size=16)


@settings(max_examples=300, deadline=None)
@given(raw=raw_advertised, extras=engine_extras)
def test_advertised_settings_cross_the_wire_unchanged(raw: dict[str, Any], extras: dict[str, Any]) -> None:
    # What a node builds: an engine's /v1/models `otela` scalars, then the cleaned command line and reports on top,
    # then its own notes.
    listed = advertised_settings({"id": "m", "otela": extras})
    settings_ = {**listed, **clean_settings(raw), "memory_mib": 512, "profile": "p"}
    assert len(settings_) <= MAX_SETTINGS
    record = NodeRecord(
        session_id="s-3",
        peer_id=OWNER.peer_id,
        provider_id="lab",
        lifecycle=Lifecycle.SERVING,
        version=1,
        models=(ModelEntry("m", "vllm", settings_),),
    ).signed(OWNER)
    wire = msgpack.unpackb(msgpack.packb(record.to_wire(), use_bin_type=True), raw=False)
    assert set(wire["models"][0]) == {
        "id",
        "engine",
        "settings",
    }  # the entry's shape the previous release knows
    back = NodeRecord.from_wire(wire)
    assert back == record and back.verify()
    for key in ADVERTISED_KEYS:
        if key in raw and clean_settings({key: raw[key]}):
            assert back.models[0].settings[key] == clean_settings({key: raw[key]})[key]
    json.dumps(back.to_json(), allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(window=st.integers(1, 2**20), engine=st.sampled_from(["vllm", "embedded", "llamacpp"]))
def test_a_record_of_the_previous_release_still_routes(window: int, engine: str) -> None:
    old = NodeRecord(
        session_id="s-4",
        peer_id=OWNER.peer_id,
        provider_id="lab",
        lifecycle=Lifecycle.SERVING,
        version=1,
        models=(ModelEntry("m", engine, {"context_length": window}),),
    ).signed(OWNER)
    back = NodeRecord.from_wire(old.to_wire())
    assert back == old and back.verify()

    def kept(text: str) -> bool:
        return bool(satisfying([back], "m", parse_constraints(text))[0])

    # It says nothing of quantization (unquantized, as before), dtype or parallelism: constraints on those do
    # not hold, the ones on what it says do.
    assert kept("quantization=none") and not kept("quantization=q4_1")
    assert not kept("dtype=bf16") and not kept("tp>=1")
    assert kept(f"context>={window}") and kept(f"engine={engine}")
