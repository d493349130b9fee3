"""Settings of the simulated engine: its models, timing model, failure injection and their flags."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentela.engines.headroom import Slo
from opentela.engines.sim_timing import TimingModel, gpu_spec, params_from_name
from opentela.errors import ConfigError

ERROR_KINDS = ("500", "502", "503", "429", "disconnect")
"""Injectable failures: an HTTP status with an OpenAI error body, or a connection dropped without an answer."""


@dataclass(frozen=True)
class SimulatedConfig:
    """Timing model, identity and failure injection of one simulated engine."""

    model: str = field(
        default="sim-model",
        metadata={
            "help": "model id served and checked in requests; repeat the flag or give a comma-separated list "
            "to host several in one engine",
            "repeat": "join",
        },
    )
    host: str = field(default="127.0.0.1", metadata={"help": "address to bind"})
    port: int = field(default=0, metadata={"help": "port to bind (0: any free port)"})
    uds: str = field(
        default="",
        metadata={"help": "also serve on this Unix socket path (the node's cheaper hop to its engine)"},
    )
    ttft_ms: float = field(default=20.0, metadata={"help": "time to first token, from arrival or dequeue"})
    itl_ms: float = field(default=5.0, metadata={"help": "inter-token latency of one request"})
    itl_per_active_ms: float = field(
        default=0.0, metadata={"help": "extra inter-token latency per other request decoding (batching cost)"}
    )
    default_max_tokens: int = field(default=16, metadata={"help": "output tokens when max_tokens is absent"})
    max_concurrency: int = field(default=64, metadata={"help": "requests decoded at once; the rest queue"})
    error_rate: float = field(default=0.0, metadata={"help": "fraction of requests answered with a 500"})
    errors: str = field(
        default="",
        metadata={
            "help": "failure rates by kind, e.g. 503=0.05,disconnect=0.01 (kinds: 500 502 503 429 disconnect)"
        },
    )
    gpu: str = field(
        default="",
        metadata={
            "help": "GPU this engine stands for (H100, A100, ...): timing from a roofline, not the fixed ms"
        },
    )
    params_b: float = field(
        default=0.0,
        metadata={"help": "model size in billions of parameters (0: read it from the model name)"},
    )
    quantization: str = field(default="", metadata={"help": "advertised quantization (empty: unquantized)"})
    context_length: int = field(default=32768, metadata={"help": "advertised context length (max_model_len)"})
    crash_after: int | None = field(
        default=None,
        metadata={"help": "serve N requests, then exit hard on the next (mid-stream if streaming)"},
    )
    crash_events: int = field(
        default=1,
        metadata={"help": "SSE events a crashing stream sends before it dies (0: right after its headers)"},
    )
    hang_after: int | None = field(
        default=None, metadata={"help": "serve N requests, then stop answering anything, health included"}
    )
    embedding_dim: int = field(default=64, metadata={"help": "length of /v1/embeddings vectors"})
    seed: int = field(default=0, metadata={"help": "seed for error injection draws"})
    log_line: str = field(
        default="",
        metadata={"help": "a line to print to stderr once (e.g. a fake NCCL timeout for fail-stop tests)"},
    )
    log_line_after: int | None = field(
        default=None, metadata={"help": "serve N requests, then print --log-line when the next one arrives"}
    )
    token_scheduling: bool = field(
        default=False,
        metadata={
            "help": "with several models: one shared executor runs one iteration at a time, of the model "
            "holding the request with the least SLO headroom (LLM-Mesh section 5.1)"
        },
    )
    slo: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "SLO of a hosted model under token scheduling, MODEL=TTFT_S,TPOT_S (repeatable; default: "
            "TTFT max(2, prompt/512) s, TPOT 0.25 s)",
            "repeat": "append",
        },
    )
    profile: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "performance profile of a hosted model, MODEL=PATH (repeatable): its iteration times under "
            "token scheduling instead of --ttft-ms/--itl-ms",
            "repeat": "append",
        },
    )

    def __post_init__(self) -> None:
        for name in ("slo", "profile"):
            # Callers building a config in code (the engine adapter's options) may pass lists.
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.ttft_ms < 0 or self.itl_ms < 0 or self.itl_per_active_ms < 0:
            raise ConfigError("simulated engine latencies must be >= 0")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ConfigError(f"error_rate must be in [0, 1], got {self.error_rate}")
        if self.max_concurrency < 1 or self.embedding_dim < 1 or self.default_max_tokens < 0:
            raise ConfigError("max_concurrency and embedding_dim must be >= 1, default_max_tokens >= 0")
        rates = self.error_rates()
        if sum(rates.values()) > 1.0:
            raise ConfigError(f"error rates add up to more than 1: {self.errors}")
        models = self.models()
        if self.gpu:
            gpu_spec(self.gpu)
            for model in models:
                if self.model_params_b(model) is None:
                    raise ConfigError(
                        f"give --params-b: the model name {model!r} says nothing about its size"
                    )
        self.slos()
        self.profile_paths()

    def models(self) -> tuple[str, ...]:
        """The hosted model ids, in the order given; the first answers requests that name no model."""
        names = tuple(m.strip() for m in self.model.split(",") if m.strip())
        if not names:
            raise ConfigError("the simulated engine needs at least one --model")
        if len(set(names)) != len(names):
            raise ConfigError(f"a model is named twice in --model {self.model!r}")
        return names

    def scheduled(self) -> bool:
        """Whether requests share the token-level executor: asked for, and more than one model to share it."""
        return self.token_scheduling and len(self.models()) > 1

    def _per_model(self, flag: str, terms: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for term in terms:
            model, sep, value = term.partition("=")
            model = model.strip()
            if not sep or not value.strip():
                raise ConfigError(f"cannot read --{flag} {term!r}: write MODEL=VALUE")
            if model not in self.models():
                raise ConfigError(f"--{flag} {term!r} names a model not hosted here ({self.model})")
            if model in out:
                raise ConfigError(f"--{flag} is given twice for {model!r}")
            out[model] = value.strip()
        return out

    def slos(self) -> dict[str, Slo]:
        """The SLO given per model (models not named get LLM-Mesh's default per request)."""
        out: dict[str, Slo] = {}
        for model, value in self._per_model("slo", self.slo).items():
            try:
                ttft, tpot = (float(x) for x in value.split(","))
            except ValueError:
                raise ConfigError(f"cannot read --slo {model}={value}: write MODEL=TTFT_S,TPOT_S") from None
            if not (ttft > 0 and tpot > 0):
                raise ConfigError(f"--slo {model}={value}: both SLOs must be > 0 seconds")
            out[model] = Slo(ttft, tpot)
        return out

    def profile_paths(self) -> dict[str, Path]:
        """The performance profile file given per model (read when the server starts, not here)."""
        return {model: Path(value) for model, value in self._per_model("profile", self.profile).items()}

    def error_rates(self) -> dict[str, float]:
        """Failure rate of each kind: `errors` parsed, plus `error_rate` as 500s."""
        rates: dict[str, float] = {"500": self.error_rate} if self.error_rate else {}
        for term in filter(None, (t.strip() for t in self.errors.split(","))):
            kind, sep, rate = term.partition("=")
            try:
                value = float(rate)
            except ValueError:
                value = -1.0
            if not sep or kind.strip() not in ERROR_KINDS or not 0.0 <= value <= 1.0:
                raise ConfigError(
                    f"cannot read {term!r} in errors: write KIND=RATE with KIND in {ERROR_KINDS}"
                )
            rates[kind.strip()] = rates.get(kind.strip(), 0.0) + value
        return rates

    def model_params_b(self, model: str | None = None) -> float | None:
        """The size in billions of `model` (default: the first hosted): `params_b`, else what its name says."""
        return self.params_b or params_from_name(model or self.models()[0])

    def timing(self, model: str | None = None) -> TimingModel:
        """The timing model of `model` (default: the first hosted): a roofline for the declared GPU, else the
        fixed latencies."""
        if self.gpu:
            return TimingModel.roofline(
                self.gpu, self.model_params_b(model) or 1.0, self.quantization, self.itl_per_active_ms
            )
        return TimingModel.fixed(self.ttft_ms, self.itl_ms, self.itl_per_active_ms)

    def advertised_settings(self, model: str | None = None) -> dict[str, Any]:
        """What /v1/models says about `model` beyond its id (nodes copy it into their records)."""
        out: dict[str, Any] = {"simulated": True}
        if self.quantization:
            out["quantization"] = self.quantization
        if self.gpu:
            out["gpu"] = gpu_spec(self.gpu)[0]
            itl = self.timing(model).itl(self.max_concurrency)
            out["throughput"] = round(self.max_concurrency / itl, 1)
        return out

    def to_argv(self) -> list[str]:
        """The flags that reproduce this config (only fields that differ from the defaults)."""
        out: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                out.append(flag)
            elif isinstance(value, tuple):
                for item in value:
                    out += [flag, str(item)]
            else:
                out += [flag, str(value)]
        return out

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add one ``--flag`` per field, with the field's help text, to `parser`."""
        for f in dataclasses.fields(cls):
            flag, text = "--" + f.name.replace("_", "-"), f.metadata["help"]
            if isinstance(f.default, bool):
                parser.add_argument(flag, action="store_true", help=text)
            elif "repeat" in f.metadata:
                # None, not the field's default: argparse would append to a default list.
                parser.add_argument(flag, action="append", default=None, help=text)
            else:
                kind = int if f.default is None else type(f.default)
                parser.add_argument(flag, type=kind, default=f.default, help=text)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> SimulatedConfig:
        """Build a config from flags parsed by `add_arguments`."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value = getattr(ns, f.name)
            repeat = f.metadata.get("repeat")
            if repeat and value is None:
                value = f.default
            elif repeat == "join":
                value = ",".join(value)
            elif repeat == "append":
                value = tuple(value)
            values[f.name] = value
        return cls(**values)

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> SimulatedConfig:
        """Parse ``otela engine simulated`` flags."""
        parser = argparse.ArgumentParser(prog="otela engine simulated")
        cls.add_arguments(parser)
        return cls.from_namespace(parser.parse_args(argv))


def add_simulated_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``otela engine simulated`` flags (one per `SimulatedConfig` field) to `parser`."""
    SimulatedConfig.add_arguments(parser)


def simulated_config_from_args(ns: argparse.Namespace) -> SimulatedConfig:
    """The config from flags parsed by `add_simulated_arguments`."""
    return SimulatedConfig.from_namespace(ns)
