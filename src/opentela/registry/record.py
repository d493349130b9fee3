"""A node's signed registry record: who it is, where to reach it, what it has, what it serves."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import msgpack

from opentela._types import Lifecycle, PeerId, SessionId
from opentela.fabric.identity import Identity, is_peer_id, verify_signature

_DOMAIN = b"otela-record-v1\x00"
MAX_TEXT = 512
MAX_LIST = 64
MAX_HARDWARE_BYTES = 16 * 1024
MAX_MEMBERSHIP_BYTES = 1024
MAX_RECORD_BYTES = 64 * 1024
"""Largest record on the wire: an honest record is 1-3 KB, with room for many models and GPUs."""
MAX_VERSION = 2**53
"""Live versions stay below this, exact in JSON; a LEFT record may reach it, so the eviction (version + 1) of any
record that passed is itself valid everywhere."""
MAX_TIMESTAMP = 1e10
"""Unix seconds (year 2286): a static bound; receivers also refuse records stamped ahead of their own clock."""
MAX_SETTINGS = 32
MAX_SETTING_TEXT = 256
MAX_INT = 2**53
REPLICA_SERVING = "serving"
"""A model entry's `replica_state` when its engine serves normally, or says nothing about its state."""
REPLICA_RECONFIGURING = "reconfiguring"
"""A model entry's `replica_state` setting while its tensor-parallel engine moves onto the ranks it has left: it keeps
its streams and queues new requests, so the gateway sends it new work only when no other replica serves."""


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class ModelEntry:
    """One served model: its id, the engine serving it and its non-default settings (quantization, context...)."""

    id: str
    engine: str = ""
    settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", _freeze(self.settings))

    def to_wire(self) -> dict[str, Any]:
        """Plain dict for msgpack/JSON."""
        return {"id": self.id, "engine": self.engine, "settings": _thaw(self.settings)}

    @property
    def replica_state(self) -> str:
        """What the engine says of this replica (its `replica_state` setting, e.g. `reconfiguring`); `serving`
        when it says nothing."""
        state = self.settings.get("replica_state")
        return state if isinstance(state, str) and state else REPLICA_SERVING


@dataclass(frozen=True)
class BlockSpan:
    """Decoder blocks [start, end) of a split model that a node serves, with what a router needs to pick it."""

    model: str
    start: int
    end: int
    total: int
    """How many blocks the whole model has."""
    cache_bytes: int = 0
    """Attention-cache memory the server has for sessions."""
    block_ms: float = 0.0
    """Measured time of one block on one token (decode), for routing and placement."""

    def to_wire(self) -> dict[str, Any]:
        """Plain dict for msgpack/JSON."""
        return {
            "model": self.model,
            "start": self.start,
            "end": self.end,
            "total": self.total,
            "cache_bytes": self.cache_bytes,
            "block_ms": self.block_ms,
        }


@dataclass(frozen=True)
class NodeRecord:
    """The value of one registry key; merge keeps the record with the greater (lifecycle, version)."""

    session_id: SessionId
    peer_id: PeerId
    provider_id: str
    lifecycle: Lifecycle
    version: int
    addrs: tuple[str, ...] = ()
    relays: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    hardware: Mapping[str, Any] = field(default_factory=dict)
    models: tuple[ModelEntry, ...] = ()
    started_at: float = 0.0
    updated_at: float = field(default_factory=time.time)
    """When the signer wrote this version (its wall clock); replicas refuse records older than the compaction
    window, so this is set on every write."""
    signer: PeerId = ""
    reason: str = ""
    signature: bytes = b""
    membership: bytes = b""  # the owner's membership proof in a closed network (fabric/tokens.py)
    blocks: tuple[BlockSpan, ...] = ()
    """Block ranges of split models this node serves (node/block_server.py)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "lifecycle", Lifecycle(self.lifecycle))
        object.__setattr__(self, "addrs", tuple(self.addrs))
        object.__setattr__(self, "relays", tuple(self.relays))
        object.__setattr__(self, "roles", tuple(self.roles))
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "blocks", tuple(self.blocks))
        object.__setattr__(self, "hardware", _freeze(self.hardware))

    def __repr__(self) -> str:
        return (
            f"<NodeRecord {self.session_id[:8]} peer=…{self.peer_id[-6:]} {self.lifecycle.name} v{self.version}"
            f" models={list(self.model_ids)}>"
        )

    @property
    def model_ids(self) -> tuple[str, ...]:
        """Ids of the served models."""
        return tuple(m.id for m in self.models)

    @property
    def rank(self) -> tuple[int, int]:
        """What merge compares: (lifecycle, version)."""
        return (int(self.lifecycle), self.version)

    # --- wire form ----------------------------------------------------------------------------------------
    def to_wire(self) -> dict[str, Any]:
        """Plain dict (signature included), for msgpack and JSON."""
        return {
            "session_id": self.session_id,
            "peer_id": self.peer_id,
            "provider_id": self.provider_id,
            "lifecycle": int(self.lifecycle),
            "version": self.version,
            "addrs": list(self.addrs),
            "relays": list(self.relays),
            "roles": list(self.roles),
            "hardware": _thaw(self.hardware),
            "models": [m.to_wire() for m in self.models],
            "started_at": self.started_at,
            "updated_at": self.updated_at,
            "signer": self.signer,
            "reason": self.reason,
            "signature": self.signature,
            # Only in closed networks, so open-network records keep their size and signed bytes.
            **({"membership": self.membership} if self.membership else {}),
            # Only on nodes serving split models, so other records keep their size and signed bytes.
            **({"blocks": [b.to_wire() for b in self.blocks]} if self.blocks else {}),
        }

    def to_json(self) -> dict[str, Any]:
        """JSON-ready view for the read-only HTTP endpoints (lifecycle by name, no signature bytes)."""
        out = self.to_wire()
        out["lifecycle"] = self.lifecycle.name
        out["signature"] = self.signature.hex()
        if self.membership:
            out["membership"] = self.membership.hex()
        return out

    def signing_payload(self) -> bytes:
        """Canonical bytes the signature covers: every field but the signature, map keys sorted."""
        body = self.to_wire()
        del body["signature"]
        return _DOMAIN + _canonical(body)

    @classmethod
    def from_wire(cls, obj: Any, *, max_bytes: int = MAX_RECORD_BYTES) -> NodeRecord:
        """Validate and build a record from untrusted input of at most `max_bytes`; ValueError on anything
        malformed."""
        if not isinstance(obj, dict):
            raise ValueError("a record must be a map")
        try:
            size = len(msgpack.packb(obj, use_bin_type=True))
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"malformed record: {exc!r}") from None
        if size > max_bytes:
            raise ValueError(f"record of {size} bytes is over the {max_bytes}-byte limit")
        try:
            return _validated(obj)
        except (KeyError, TypeError, OverflowError, RecursionError) as exc:
            # RecursionError: nesting msgpack accepts but no record has (the schema checks shape before
            # walking anything deep; this is the backstop).
            raise ValueError(f"malformed record: {type(exc).__name__}") from None

    # --- signing ------------------------------------------------------------------------------------------
    def signed(self, identity: Identity) -> NodeRecord:
        """This record signed by `identity` (which becomes the signer)."""
        unsigned = dataclasses.replace(self, signer=identity.peer_id, signature=b"")
        return dataclasses.replace(unsigned, signature=identity.sign(unsigned.signing_payload()))

    def verify(self) -> bool:
        """True when the signature is valid and the signer may write this state.

        Only the owner writes its record; the one exception is an eviction (LEFT), which another member may sign,
        and must give a reason for.
        """
        if self.signer != self.peer_id and not (self.lifecycle is Lifecycle.LEFT and self.reason):
            return False
        return verify_signature(self.signer, self.signing_payload(), self.signature)

    def next(self, identity: Identity, **changes: Any) -> NodeRecord:
        """The owner's next version: apply `changes`, bump the version, stamp the time, sign."""
        changes.setdefault("updated_at", time.time())
        return dataclasses.replace(self, version=self.version + 1, **changes).signed(identity)

    def tombstone(self, **changes: Any) -> NodeRecord:
        """This record as LEFT with only what merging and GC need (unsigned: the writer signs it).

        Addresses, roles, hardware and models go: a tombstone lives for the retention window, and a dead
        session's payload is of no use to anyone, so it must not cost every replica its size for a week.
        """
        return dataclasses.replace(
            self,
            lifecycle=Lifecycle.LEFT,
            addrs=(),
            relays=(),
            roles=(),
            hardware={},
            models=(),
            blocks=(),
            **changes,
        )


def _canonical(obj: Any) -> bytes:
    def norm(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: norm(v[k]) for k in sorted(v)}
        if isinstance(v, list | tuple):
            return [norm(x) for x in v]
        return v

    return msgpack.packb(norm(obj), use_bin_type=True)


def _text(obj: dict[str, Any], key: str, *, peer: bool = False, empty_ok: bool = True) -> str:
    value = obj[key]
    if not isinstance(value, str) or len(value) > MAX_TEXT or (not empty_ok and not value):
        raise ValueError(f"record field {key!r} must be a string of at most {MAX_TEXT} characters")
    if peer and not is_peer_id(value):
        raise ValueError(f"record field {key!r} is not a peer id")
    return value


def _texts(obj: dict[str, Any], key: str) -> tuple[str, ...]:
    value = obj[key]
    if not isinstance(value, list | tuple) or len(value) > MAX_LIST:
        raise ValueError(f"record field {key!r} must be a list of at most {MAX_LIST} strings")
    if not all(isinstance(v, str) and len(v) <= MAX_TEXT for v in value):
        raise ValueError(f"record field {key!r} must hold strings")
    return tuple(value)


def _number(obj: Mapping[str, Any], key: str, *, low: float = 0.0, high: float = float(MAX_INT)) -> float:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ValueError(f"record field {key!r} must be a finite number in [{low:g}, {high:g}]")
    return float(value)


def _optional_int(obj: Mapping[str, Any], key: str, where: str) -> None:
    value = obj.get(key)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_INT
    ):
        raise ValueError(f"record {where}.{key} must be a non-negative integer")


def _optional_text(obj: Mapping[str, Any], key: str, where: str) -> None:
    value = obj.get(key)
    if value is not None and (not isinstance(value, str) or len(value) > MAX_TEXT):
        raise ValueError(f"record {where}.{key} must be a string of at most {MAX_TEXT} characters")


def _scalar_ok(value: Any) -> bool:
    """A setting's value: a short string, a boolean, null, an integer or a finite float of JSON's exact range."""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return -MAX_INT < value < MAX_INT
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and len(value) <= MAX_SETTING_TEXT


def _extras_ok(obj: Mapping[str, Any], known: frozenset[str]) -> bool:
    """Keys a newer version may add: accepted when they are short names of scalars, at most MAX_SETTINGS."""
    extra = [k for k in obj if k not in known]
    return len(extra) <= MAX_SETTINGS and all(
        isinstance(k, str) and len(k) <= 64 and _scalar_ok(obj[k]) for k in extra
    )


_HARDWARE_KEYS = frozenset({"gpus", "gpu_source", "cpu", "ram_mib", "os", "hostname"})
_GPU_KEYS = frozenset({"index", "name", "memory_mib", "uuid"})
_CPU_KEYS = frozenset({"model", "arch", "cores", "threads", "usable", "flags"})


def _check_hardware(hardware: Any) -> None:
    """The shape `node.hardware.probe_hardware` writes, every part optional, each bounded and typed."""
    if not isinstance(hardware, dict) or not _extras_ok(hardware, _HARDWARE_KEYS):
        raise ValueError("record hardware must be a map of the known fields")
    gpus = hardware.get("gpus")
    if gpus is not None:
        if not isinstance(gpus, list | tuple) or len(gpus) > MAX_LIST:
            raise ValueError(f"record hardware.gpus must be a list of at most {MAX_LIST} maps")
        for gpu in gpus:
            if not isinstance(gpu, dict) or not _extras_ok(gpu, _GPU_KEYS):
                raise ValueError("record hardware.gpus entries must be maps of the known fields")
            _optional_int(gpu, "index", "hardware.gpus[]")
            _optional_int(gpu, "memory_mib", "hardware.gpus[]")
            _optional_text(gpu, "name", "hardware.gpus[]")
            _optional_text(gpu, "uuid", "hardware.gpus[]")
    cpu = hardware.get("cpu")
    if cpu is not None:
        if not isinstance(cpu, dict) or not _extras_ok(cpu, _CPU_KEYS):
            raise ValueError("record hardware.cpu must be a map of the known fields")
        for key in ("cores", "threads", "usable"):
            _optional_int(cpu, key, "hardware.cpu")
        for key in ("model", "arch"):
            _optional_text(cpu, key, "hardware.cpu")
        flags = cpu.get("flags")
        if flags is not None and (
            not isinstance(flags, list | tuple)
            or len(flags) > MAX_LIST
            or not all(isinstance(f, str) and len(f) <= 64 for f in flags)
        ):
            raise ValueError("record hardware.cpu.flags must be a list of short strings")
    _optional_int(hardware, "ram_mib", "hardware")
    for key in ("gpu_source", "os", "hostname"):
        _optional_text(hardware, key, "hardware")


def _model_entry(m: Any) -> ModelEntry:
    if not isinstance(m, dict) or set(m) - {"id", "engine", "settings"}:
        raise ValueError("a model entry must be a map of id, engine and settings")
    settings = m.get("settings", {})
    if (
        not isinstance(settings, dict)
        or len(settings) > MAX_SETTINGS
        or not all(isinstance(k, str) and len(k) <= 64 and _scalar_ok(v) for k, v in settings.items())
    ):
        raise ValueError(
            f"model settings must be a map of at most {MAX_SETTINGS} short names to scalars "
            f"(strings of at most {MAX_SETTING_TEXT} characters, finite numbers, booleans)"
        )
    return ModelEntry(_text(m, "id", empty_ok=False), _text(m, "engine"), settings)


def _block_span(b: Any) -> BlockSpan:
    if not isinstance(b, dict) or set(b) - {"model", "start", "end", "total", "cache_bytes", "block_ms"}:
        raise ValueError("a block span must be a map of model, start, end, total, cache_bytes and block_ms")
    start, end, total = (int(_number(b, k, high=1_000_000)) for k in ("start", "end", "total"))
    if not (start < end <= total) or any(not isinstance(b[k], int) for k in ("start", "end", "total")):
        raise ValueError("a block span needs integers start < end <= total")
    return BlockSpan(
        _text(b, "model", empty_ok=False),
        start,
        end,
        total,
        int(_number(b, "cache_bytes")) if "cache_bytes" in b else 0,
        _number(b, "block_ms", high=1e9) if "block_ms" in b else 0.0,
    )


def _validated(obj: dict[str, Any]) -> NodeRecord:
    lifecycle = obj["lifecycle"]
    if isinstance(lifecycle, bool) or lifecycle not in {int(x) for x in Lifecycle}:
        raise ValueError(f"unknown lifecycle {lifecycle!r}")
    version = obj["version"]
    # A tombstone may be one above the live bound: it is the eviction (or departure) of a live record.
    top = MAX_VERSION if lifecycle == Lifecycle.LEFT else MAX_VERSION - 1
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= top:
        raise ValueError("record version must be an integer in [0, 2^53) (LEFT: [0, 2^53])")
    hardware = obj["hardware"]
    # Shape first: it walks only the known, shallow fields, so nothing deep is ever recursed into.
    _check_hardware(hardware)
    if len(_canonical(hardware)) > MAX_HARDWARE_BYTES:
        raise ValueError(f"record hardware must be a map of at most {MAX_HARDWARE_BYTES} bytes")
    models_raw = obj["models"]
    if not isinstance(models_raw, list | tuple) or len(models_raw) > MAX_LIST:
        raise ValueError("record models must be a list")
    models = tuple(_model_entry(m) for m in models_raw)
    signature = obj["signature"]
    if not isinstance(signature, bytes) or len(signature) != 64:
        raise ValueError("record signature must be 64 bytes")
    blocks_raw = obj.get("blocks", [])
    if not isinstance(blocks_raw, list | tuple) or len(blocks_raw) > MAX_LIST:
        raise ValueError(f"record blocks must be a list of at most {MAX_LIST} spans")
    blocks = tuple(_block_span(b) for b in blocks_raw)
    membership = obj.get("membership", b"")
    if not isinstance(membership, bytes) or len(membership) > MAX_MEMBERSHIP_BYTES:
        raise ValueError(f"record membership must be at most {MAX_MEMBERSHIP_BYTES} bytes")
    record = NodeRecord(
        session_id=_text(obj, "session_id", empty_ok=False),
        peer_id=_text(obj, "peer_id", peer=True),
        provider_id=_text(obj, "provider_id"),
        lifecycle=Lifecycle(lifecycle),
        version=version,
        addrs=_texts(obj, "addrs"),
        relays=_texts(obj, "relays"),
        roles=_texts(obj, "roles"),
        hardware=hardware,
        models=models,
        started_at=_number(obj, "started_at", high=MAX_TIMESTAMP),
        updated_at=_number(obj, "updated_at", high=MAX_TIMESTAMP),
        signer=_text(obj, "signer", peer=True),
        reason=_text(obj, "reason"),
        signature=signature,
        membership=membership,
        blocks=blocks,
    )
    if record.lifecycle is Lifecycle.LEFT and (
        record.addrs or record.relays or record.roles or record.hardware or record.models or record.blocks
    ):
        raise ValueError("a LEFT record is a tombstone: it carries no addresses, roles, hardware or models")
    return record
