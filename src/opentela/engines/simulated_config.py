"""Settings of the simulated engine: its timing model, identity and failure injection, and their flags."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentela.engines.sim_timing import TimingModel, gpu_spec, params_from_name
from opentela.errors import ConfigError

ERROR_KINDS = ("500", "502", "503", "429", "disconnect")
"""Injectable failures: an HTTP status with an OpenAI error body, or a connection dropped without an answer."""


@dataclass(frozen=True)
class SimulatedConfig:
    """Timing model, identity and failure injection of one simulated engine."""

    model: str = field(default="sim-model", metadata={"help": "model id served and checked in requests"})
    host: str = field(default="127.0.0.1", metadata={"help": "address to bind"})
    port: int = field(default=0, metadata={"help": "port to bind (0: any free port)"})
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

    def __post_init__(self) -> None:
        if self.ttft_ms < 0 or self.itl_ms < 0 or self.itl_per_active_ms < 0:
            raise ConfigError("simulated engine latencies must be >= 0")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ConfigError(f"error_rate must be in [0, 1], got {self.error_rate}")
        if self.max_concurrency < 1 or self.embedding_dim < 1 or self.default_max_tokens < 0:
            raise ConfigError("max_concurrency and embedding_dim must be >= 1, default_max_tokens >= 0")
        rates = self.error_rates()
        if sum(rates.values()) > 1.0:
            raise ConfigError(f"error rates add up to more than 1: {self.errors}")
        if self.gpu:
            gpu_spec(self.gpu)
            if self.model_params_b() is None:
                raise ConfigError(
                    f"give --params-b: the model name {self.model!r} says nothing about its size"
                )

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

    def model_params_b(self) -> float | None:
        """The model size in billions: `params_b`, else what the model name says."""
        return self.params_b or params_from_name(self.model)

    def timing(self) -> TimingModel:
        """The timing model: a roofline for the declared GPU, else the fixed latencies."""
        if self.gpu:
            return TimingModel.roofline(
                self.gpu, self.model_params_b() or 1.0, self.quantization, self.itl_per_active_ms
            )
        return TimingModel.fixed(self.ttft_ms, self.itl_ms, self.itl_per_active_ms)

    def advertised_settings(self) -> dict[str, Any]:
        """What /v1/models says about this engine beyond the model id (nodes copy it into their records)."""
        out: dict[str, Any] = {"simulated": True}
        if self.quantization:
            out["quantization"] = self.quantization
        if self.gpu:
            out["gpu"] = gpu_spec(self.gpu)[0]
            out["throughput"] = round(self.max_concurrency / self.timing().itl(self.max_concurrency), 1)
        return out

    def to_argv(self) -> list[str]:
        """The flags that reproduce this config (only fields that differ from the defaults)."""
        out: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                out += ["--" + f.name.replace("_", "-"), str(value)]
        return out

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add one ``--flag`` per field, with the field's help text, to `parser`."""
        for f in dataclasses.fields(cls):
            kind = int if f.default is None else type(f.default)
            parser.add_argument(
                "--" + f.name.replace("_", "-"), type=kind, default=f.default, help=f.metadata["help"]
            )

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> SimulatedConfig:
        """Build a config from flags parsed by `add_arguments`."""
        return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)})

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
