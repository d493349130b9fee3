"""Settings of the ingress HTTP gateway."""

from __future__ import annotations

from dataclasses import dataclass, field

from opentela.cors import CorsPolicy
from opentela.errors import ConfigError
from opentela.gateway.model_names import ModelNames
from opentela.gateway.timeout_classes import TimeoutClasses


@dataclass(frozen=True)
class GatewayConfig:
    """How the ingress listens, routes, limits, times out and retries."""

    http: str = field(
        default="127.0.0.1:8092", metadata={"help": "HOST:PORT the OpenAI-compatible API listens on."}
    )
    max_body_bytes: int = field(
        default=8 * 1024 * 1024, metadata={"help": "Largest request body accepted; larger ones get 413."}
    )
    policy: str = field(
        default="random",
        metadata={
            "help": "Routing policy: `random`, `round_robin`, `weighted`, `least_loaded`, "
            "`least_loaded_tokens`, `slo_headroom`, `prefix_affinity`, or an operator's `module:Class`."
        },
    )
    request_policies: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "Policies a request may choose with `X-Otela-Policy` or `metadata.policy` "
            "(empty: requests cannot choose)."
        },
    )
    trusted_providers: tuple[str, ...] = field(
        default=(),
        metadata={"help": "Default provider allowlist for requests that name none (empty: every provider)."},
    )
    max_output_tokens: int = field(
        default=131072,
        metadata={
            "help": "Largest `max_tokens` accepted for a model none of whose replicas advertises a context "
            "length; a model's advertised context length is its cap otherwise (larger asks get 400)."
        },
    )
    max_tokens_caps: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "`MODEL=N` entries: the largest `max_tokens` accepted for MODEL, in place of its context "
            "length."
        },
    )
    profiles_dir: str = field(
        default="",
        metadata={
            "help": "Directory of performance profiles (`otela profile` files) that `slo_headroom` validates "
            "against, matched to replicas by the profile id their nodes publish; empty: none."
        },
    )
    slos: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "`MODEL=TTFT_S,TPOT_S` entries: the SLOs `slo_headroom` holds requests of MODEL to; other "
            "models get LLM-Mesh's max(2, prompt/512) s to first token and 0.25 s per token."
        },
    )
    cold_start_timeout: float = field(
        default=120.0,
        metadata={
            "help": "Seconds a request for a serverless model with no live replica is held while a controller "
            "starts one (then 503 with Retry-After); 0: never hold, answer at once."
        },
    )
    cold_start_queue: int = field(
        default=256,
        metadata={"help": "Requests held for cold starts at once, over all models; more are answered 503."},
    )
    connect_timeout: float = field(
        default=5.0, metadata={"help": "Seconds to open a stream to the serving node (dial included)."}
    )
    first_byte_timeout: float = field(
        default=300.0,
        metadata={
            "help": "Seconds to wait for the response head (and a stream's first chunk) from a replica."
        },
    )
    idle_timeout: float = field(
        default=120.0,
        metadata={"help": "Seconds a started stream may stay silent before it ends with an error event."},
    )
    total_timeout: float = field(
        default=900.0, metadata={"help": "Absolute deadline of one request, in seconds."}
    )
    max_retries: int = field(
        default=2,
        metadata={
            "help": "Other replicas tried after a transport failure or an engine 5xx, before the client "
            "has seen a byte."
        },
    )
    timeout_classes: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "`NAME: KEY=VALUE ...` entries defining or changing a timeout class; keys are "
            "`first_byte_timeout`, `idle_timeout`, `total_timeout` and `max_retries`, unnamed ones keep the "
            "built-in class's values, else the default class's (the four settings above). Built in: "
            "`reasoning` (1800 s to first byte, 300 s idle, 5400 s in all, 1 retry; docs/gateway.md)."
        },
    )
    model_classes: tuple[str, ...] = field(
        default=("*R1*=reasoning", "*Thinking*=reasoning", "*QwQ*=reasoning"),
        metadata={
            "help": "`PATTERN=CLASS` entries: models whose id matches the glob (case-insensitive; the first "
            "match wins) get that timeout class. Others get `reasoning` when a replica advertises the setting "
            "`reasoning = true`, else `default`."
        },
    )
    model_aliases: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "`ALIAS=MODEL_ID` entries: requests naming ALIAS go to replicas of MODEL_ID (usage records "
            "MODEL_ID); `/v1/models` lists ALIAS with `alias_for`. An alias must point at a served id."
        },
    )
    retired_models: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "`NAME[=REPLACEMENT][|MESSAGE]` entries: requests naming NAME get 404 `model_not_found` "
            "saying it was retired, naming REPLACEMENT and MESSAGE when given."
        },
    )
    default_model: str = field(
        default="",
        metadata={
            "help": "Model (an id or an alias) for requests that name none; empty: such requests get 400."
        },
    )
    prefix_affinity_slack: int = field(
        default=4,
        metadata={
            "help": "`prefix_affinity`: requests in flight the replica holding a conversation's prefix may "
            "have beyond the least loaded replica before the conversation moves to that one."
        },
    )
    prefix_affinity_ttl: float = field(
        default=600.0,
        metadata={
            "help": "`prefix_affinity`: seconds a prefix stays tied to the replica that last served it "
            "(engines evict cached prefixes; a later turn is placed afresh)."
        },
    )
    prefix_affinity_entries: int = field(
        default=65536,
        metadata={"help": "`prefix_affinity`: prefixes remembered at most; those tied longest ago go first."},
    )
    cooldown_failures: int = field(
        default=3,
        metadata={"help": "Consecutive failed attempts that put a replica in cooldown (0: never)."},
    )
    cooldown_seconds: float = field(
        default=10.0, metadata={"help": "How long a replica in cooldown gets no traffic from this ingress."}
    )
    cors_origins: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "Origins whose browser pages may call the `/v1` API (CORS): `*` or exact origins such as "
            "`https://app.example.org`. Empty: CORS off, since the ingress authenticates no one and any web page "
            "a user opens could otherwise use an ingress their browser reaches (a local one included)."
        },
    )
    server_timing: bool = field(
        default=False,
        metadata={
            "help": "Add a Server-Timing header with the per-stage times of each request (benchmarks)."
        },
    )
    header_timeout: float = field(
        default=15.0,
        metadata={
            "help": "Seconds a client has to send a complete request head once its first byte arrived; "
            "slower connections are closed (slow-header floods)."
        },
    )
    keepalive_timeout: float = field(
        default=75.0,
        metadata={
            "help": "Seconds an idle client connection stays open waiting for its next request (also from "
            "connecting to the first request)."
        },
    )
    split_model_files: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "`MODEL=PATH` entries: the GGUF file of a split model, whose embedding, final norm, LM head "
            "and tokenizer the ingress runs (the shipped SmolLM2 is found without one)."
        },
    )
    split_forwarding: str = field(
        default="client",
        metadata={
            "help": "How a split model's hidden states travel: `client` (each server answers the ingress, which "
            "keeps every server's inputs and replaces a failed server alone) or `server` (each server passes "
            "its output to the next; a failure replays the session on a whole new chain)."
        },
    )
    split_routing: str = field(
        default="ws_rr",
        metadata={
            "help": "How the ingress picks a split model's chain: `ws_rr` (waiting-time-aware shortest path), "
            "`shortest` (per-token time only) or `petals` (PETALS' own heuristic)."
        },
    )
    split_step_timeout: float = field(
        default=60.0,
        metadata={
            "help": "Seconds one step of a split model may take on one server before it counts as failed."
        },
    )
    split_max_failovers: int = field(
        default=3,
        metadata={"help": "Servers of a split model one request may replace before it fails."},
    )
    split_head_threads: int = field(
        default=1,
        metadata={
            "help": "BLAS threads for a split model's embedding and LM head at the ingress (the same count as "
            "the block servers' keeps results reproducible, docs/pipeline.md); 0: NumPy's default."
        },
    )

    def __post_init__(self) -> None:
        if self.split_forwarding not in ("client", "server"):
            raise ConfigError(f"split_forwarding must be `client` or `server`, not {self.split_forwarding!r}")
        if self.split_routing not in ("ws_rr", "shortest", "petals"):
            raise ConfigError(
                f"split_routing must be `ws_rr`, `shortest` or `petals`, not {self.split_routing!r}"
            )
        if not self.split_step_timeout > 0 or self.split_max_failovers < 0:
            raise ConfigError("split_step_timeout must be positive and split_max_failovers >= 0")
        if self.split_head_threads < 0:
            raise ConfigError("split_head_threads must be >= 0 (0: NumPy's default)")
        self.split_files()
        self.cors_policy()
        if self.max_output_tokens < 1:
            raise ConfigError(f"max_output_tokens must be at least 1, got {self.max_output_tokens}")
        self.output_caps()
        TimeoutClasses.from_config(self)
        self.model_names()
        if (
            self.prefix_affinity_slack < 0
            or not self.prefix_affinity_ttl > 0
            or self.prefix_affinity_entries < 1
        ):
            raise ConfigError(
                "prefix_affinity_slack must be >= 0, prefix_affinity_ttl positive and prefix_affinity_entries >= 1"
            )

    def split_files(self) -> dict[str, str]:
        """`split_model_files` as a mapping of model to GGUF path; a ConfigError names a bad entry."""
        out: dict[str, str] = {}
        for pair in self.split_model_files:
            model, sep, path = pair.partition("=")
            if not sep or not model.strip() or not path.strip():
                raise ConfigError(f"split_model_files entries are MODEL=PATH, got {pair!r}")
            out[model.strip()] = path.strip()
        return out

    def output_caps(self) -> dict[str, int]:
        """`max_tokens_caps` as a mapping of model to cap; a ConfigError names an entry that is not MODEL=N."""
        out: dict[str, int] = {}
        for pair in self.max_tokens_caps:
            model, sep, number = pair.rpartition("=")
            cap = int(number) if number.strip().isdigit() else 0
            if not sep or not model.strip() or cap < 1:
                raise ConfigError(
                    f"max_tokens_caps entries are MODEL=N with N a positive integer, got {pair!r}"
                )
            out[model.strip()] = cap
        return out

    def model_names(self) -> ModelNames:
        """The alias table, retired names and default model; a ConfigError names a bad entry."""
        return ModelNames.from_entries(self.model_aliases, self.retired_models, self.default_model)

    def cors_policy(self) -> CorsPolicy | None:
        """The origins `cors_origins` allows (None: CORS off); a ConfigError names a malformed entry."""
        return CorsPolicy.from_setting(self.cors_origins, "gateway.cors_origins")
