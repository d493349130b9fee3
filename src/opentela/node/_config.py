"""Settings of a node: where it listens, whom it bootstraps from, who provides it and what engine it runs."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from opentela.errors import ConfigError
from opentela.fabric.identity import is_peer_id

DEFAULT_FATAL_LOG_PATTERNS: tuple[str, ...] = (
    r"NCCL.*\btimeout\b",
    r"NCCL.*\btimed out\b",
    r"Watchdog caught collective operation timeout",
    r"\bNCCL error\b",
    r"CUDA out of memory",
    r"\bCUDA error\b",
    r"illegal memory access",
    r"uncorrectable ECC",
    r"EngineDeadError",
)
"""Engine log lines that mean the engine (or its GPU) cannot go on: NCCL timeouts and errors, CUDA faults."""


class Role(enum.StrEnum):
    """What a node does besides joining the mesh; the values are the spellings of files, variables and flags."""

    WORKER = "worker"
    INGRESS = "ingress"
    CONTROLLER = "controller"  # set by `otela controller` only


class Reachability(enum.StrEnum):
    """How peers reach a node: dialling it, through relays, or whichever a bootstrap peer finds works."""

    PUBLIC = "public"
    PRIVATE = "private"
    AUTO = "auto"


def _as_enum(kind: type[enum.StrEnum], name: str, value: object) -> enum.StrEnum:
    """`value` as a member of `kind`, or a ConfigError listing the allowed spellings."""
    try:
        return kind(str(value))
    except ValueError:
        allowed = ", ".join(f"`{m.value}`" for m in kind)
        raise ConfigError(f"[node] {name} must be one of {allowed}, not {value!r}") from None


@dataclass(frozen=True)
class NodeConfig:
    """Identity, addresses, role and engine of one node."""

    listen: str = field(
        default="0.0.0.0:0",
        metadata={"help": "HOST:PORT the fabric (peer-to-peer TLS) listens on; port 0 picks a free port."},
    )
    advertise: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "Addresses other peers should dial (default: the listen address, or this host's IPs)."
        },
    )
    bootstrap: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "Peers to join through: HOST:PORT, PEERID@HOST:PORT or /ip4/.../tcp/.../p2p/PEERID."
        },
    )
    provider_id: str = field(
        default="",
        metadata={"help": "Who provides this node; users name providers they trust (default: user@host)."},
    )
    key_file: str = field(
        default="",
        metadata={
            "help": "Ed25519 identity key (default: the first key of $XDG_CONFIG_HOME/opentela no running node "
            "holds: identity.key, identity-2.key, ...)."
        },
    )
    role: Role = field(
        default=Role.WORKER, metadata={"help": "`worker`, or `ingress` to also serve the HTTP API."}
    )
    engine: str = field(
        default="", metadata={"help": "Engine shorthand (`embedded`, `simulated`) when no command is given."}
    )
    engine_port: int = field(
        default=0, metadata={"help": "Port of the engine command's OpenAI server (0: detect or pick one)."}
    )
    log_dir: str = field(
        default="", metadata={"help": "Where engine logs go (default: $XDG_STATE_HOME/opentela/logs)."}
    )
    ready_timeout: float = field(
        default=900.0,
        metadata={"help": "Seconds the engine may take to answer /v1/models before the node gives up."},
    )
    stop_timeout: float = field(
        default=10.0, metadata={"help": "Seconds between SIGTERM and SIGKILL when stopping the engine."}
    )
    max_body_bytes: int = field(
        default=8 * 1024 * 1024,
        metadata={"help": "Largest tunnelled request this node accepts for its engine."},
    )
    reachability: Reachability = field(
        default=Reachability.AUTO,
        metadata={
            "help": "`public` (peers can dial us), `private` (outbound only: reached through relay slots "
            "reserved on the bootstrap peers) or `auto` (a bootstrap peer dials us back; private if it cannot)."
        },
    )
    trace_dir: str = field(
        default="",
        metadata={"help": "If set, append a line per registry change applied here to DIR/SESSION.trace."},
    )
    health_interval: float = field(
        default=10.0,
        metadata={
            "help": "Seconds between health checks of a serving engine (GET its health path); 0: none."
        },
    )
    state_interval: float = field(
        default=1.0,
        metadata={
            "help": "Seconds between reads of a serving engine's health path (its /v1/models) for changes to what it "
            "advertises, such as a tensor-parallel replica reconfiguring; the record follows within about this "
            "long. Failed reads between health checks do not count toward health_failures. 0: read only at "
            "health checks."
        },
    )
    health_timeout: float = field(
        default=10.0,
        metadata={"help": "Seconds one engine health check may take before it counts as failed."},
    )
    health_failures: int = field(
        default=3,
        metadata={
            "help": "Consecutive failed health checks that make the node fail-stop (exit 5); 0: never."
        },
    )
    unhealthy_limit: float = field(
        default=120.0,
        metadata={
            "help": "Seconds without a passing health check after which the node fail-stops (exit 5); 0: never."
        },
    )
    fatal_log_patterns: tuple[str, ...] = field(
        default=DEFAULT_FATAL_LOG_PATTERNS,
        metadata={
            "help": "Regular expressions (case-insensitive) that, matched by an engine log line, make the node "
            "fail-stop (exit 6); an empty list turns log watching off."
        },
    )
    log_sink: str = field(
        default="",
        metadata={
            "help": "Where a node that stops on a fatal condition ships its log tail: a file path (appended) "
            "or an http(s):// URL (JSON POST); empty: nowhere."
        },
    )
    log_sink_timeout: float = field(
        default=10.0,
        metadata={"help": "Seconds shipping the log tail may take before the node exits anyway."},
    )
    controllers: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "Peer ids of the fleet controllers allowed to assign a model to this node while it is idle "
            "(an assignment runs an engine command here); empty: the node refuses every assignment."
        },
    )
    engine_profile: str = field(
        default="",
        metadata={
            "help": "Performance profile file (`otela profile`) of the engine this node is started with; its id "
            "is published with the engine's models so `slo_headroom` gateways can validate against it."
        },
    )
    engine_memory_mib: int = field(
        default=0,
        metadata={
            "help": "Memory this node lends to engines that controllers start beside each other (each assignment "
            "names its footprint); 0: the GPUs' total memory, or the RAM on a node without GPUs."
        },
    )
    blocks: str = field(
        default="",
        metadata={
            "help": "`MODEL:START-END`: serve decoder blocks [START, END) of a split model (a half-open range, "
            "so 0-10, 10-20 and 20-30 chain), e.g. `SmolLM2-135M-Instruct:0-10`; empty: none."
        },
    )
    blocks_model_file: str = field(
        default="",
        metadata={
            "help": "GGUF file holding the split model's weights (default: the shipped SmolLM2 when MODEL is "
            "SmolLM2-135M-Instruct)."
        },
    )
    blocks_cache_mib: int = field(
        default=256,
        metadata={"help": "Memory for the attention caches of the block server's sessions, in MiB."},
    )
    blocks_threads: int = field(
        default=1,
        metadata={
            "help": "BLAS threads for the block math; every server of a model should use the same count, which "
            "keeps a replayed session bit-exact (docs/pipeline.md); 0: NumPy's default (one per core)."
        },
    )
    blocks_session_ttl: float = field(
        default=300.0,
        metadata={
            "help": "Seconds a block server's session may sit idle before its cache may be evicted for a new one."
        },
    )
    accept_assignments: str = field(
        default="listed",
        metadata={
            "help": "`listed`: only the `controllers` may assign work; `any`: every peer of the mesh may "
            "(it can then run commands on this machine: for local demos only)."
        },
    )
    bootstrap_warn_after: float = field(
        default=30.0,
        metadata={
            "help": "Seconds a bootstrap address may go unanswered, or a worker stay without any peer, before "
            "the node logs a WARNING saying what to do (`otela status` shows it too); 0: never."
        },
    )
    no_peers_warn_after: float = field(
        default=60.0,
        metadata={
            "help": "Seconds an ingress may have no peer before it logs a WARNING on how to add providers "
            "(`otela status` shows it too); 0: never."
        },
    )
    log_tail_lines: int = field(
        default=200,
        metadata={"help": "Lines of the engine log and of the node's own log in a fail-stop report."},
    )

    def __post_init__(self) -> None:
        # Files, variables and flags give plain strings: hold the members, so a typo fails at load time.
        object.__setattr__(self, "role", _as_enum(Role, "role", self.role))
        object.__setattr__(self, "reachability", _as_enum(Reachability, "reachability", self.reachability))
        for name in (
            "health_interval",
            "state_interval",
            "health_failures",
            "unhealthy_limit",
            "log_tail_lines",
            "bootstrap_warn_after",
            "no_peers_warn_after",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"[node] {name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("health_timeout", "log_sink_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"[node] {name} must be positive, got {getattr(self, name)!r}")
        for pattern in self.fatal_log_patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(
                    f"[node] fatal log pattern {pattern!r} is not a valid regular expression: {exc}"
                ) from None
        if self.blocks:
            self.block_range()
        if self.blocks_cache_mib < 1 or not self.blocks_session_ttl > 0:
            raise ConfigError("[node] blocks_cache_mib must be >= 1 and blocks_session_ttl positive")
        if self.blocks_threads < 0:
            raise ConfigError("[node] blocks_threads must be >= 0 (0: NumPy's default)")
        if self.accept_assignments not in ("listed", "any"):
            raise ConfigError(
                f"[node] accept_assignments must be `listed` or `any`, not {self.accept_assignments!r}"
            )
        for peer in self.controllers:
            if not is_peer_id(peer):
                raise ConfigError(f"[node] controllers: {peer!r} is not a peer id (12D3KooW...)")
        sink = self.log_sink.strip()
        if "://" in sink and not sink.startswith(("file://", "http://", "https://")):
            raise ConfigError(
                f"[node] log_sink {sink!r}: use a file path, file://PATH, http:// or https:// URL"
            )

    def block_range(self) -> tuple[str, int, int]:
        """`blocks` as (model, start, end); a ConfigError says what a malformed value should look like."""
        model, sep, span = self.blocks.rpartition(":")
        first, dash, last = span.partition("-")
        if not (sep and model.strip() and dash and first.strip().isdigit() and last.strip().isdigit()):
            raise ConfigError(
                f"[node] blocks must be MODEL:START-END, e.g. SmolLM2-135M-Instruct:0-10; got {self.blocks!r}"
            )
        start, end = int(first), int(last)
        if not start < end:
            raise ConfigError(
                f"[node] blocks {self.blocks!r}: START must be below END (the range is [START, END))"
            )
        return model.strip(), start, end
