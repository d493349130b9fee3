"""SLO headroom: admit a request only to a replica where a shadow validation says no SLO breaks, preferring CPU
nodes and, among them, the replica already running the largest batch (LLM-Mesh's sections 5.3 and 7.2).

The ingress knows what it has in flight on every node (the requests it sent there, when, with how long a prompt),
and each replica's performance profile by the id its node publishes (`profile` in the model entry's settings,
files from `gateway.profiles_dir`). For each candidate it rebuilds the node's instances from those requests (the
tokens a request has produced are estimated from its profile: prefill, then one token per decode iteration) and
runs `engines.headroom.shadow_validate` with the new request on the candidate's instance. Among the replicas that
pass: CPU before GPU, then the largest batch (bin-packing, so small instances drain and are recycled). When none
passes, the ingress asks a controller for another instance (`on_overload`) and the request goes to the least
loaded replica meanwhile; replicas without a known profile are used only then. This ingress sees only its own
requests: with several ingresses each validates against part of the load (docs/serverless.md).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentela.engines.headroom import InstanceLoad, RequestState, Slo, shadow_validate
from opentela.engines.profile import PerformanceProfile
from opentela.errors import ConfigError
from opentela.gateway.policies.base import RoutedRequest, register_policy
from opentela.registry.record import NodeRecord

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Tracked:
    """A request this ingress has in flight on a node."""

    model: str
    start: float
    input_tokens: int
    slo: Slo


def parse_slos(entries: Sequence[str]) -> dict[str, Slo]:
    """`MODEL=TTFT_S,TPOT_S` entries as SLOs by model (ConfigError on a malformed one)."""
    out = {}
    for entry in entries:
        model, _, values = entry.rpartition("=")
        try:
            ttft, tpot = (float(v) for v in values.split(","))
        except ValueError:
            raise ConfigError(f"gateway slos: {entry!r} is not MODEL=TTFT_S,TPOT_S") from None
        if not model or ttft <= 0 or tpot <= 0:
            raise ConfigError(f"gateway slos: {entry!r} needs a model and positive seconds")
        out[model] = Slo(ttft, tpot)
    return out


def load_profiles(directory: str) -> dict[str, PerformanceProfile]:
    """Every profile file (*.json) in `directory`, by profile id."""
    if not directory:
        return {}
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise ConfigError(f"gateway profiles_dir {directory!r} is not a directory")
    profiles = {}
    for file in sorted(path.glob("*.json")):
        profile = PerformanceProfile.load(file)
        profiles[profile.profile_id] = profile
    return profiles


@register_policy("slo_headroom")
class SloHeadroomPolicy:
    """See the module's docstring."""

    name = "slo_headroom"

    def __init__(
        self,
        profiles: Mapping[str, PerformanceProfile] | None = None,
        slos: Mapping[str, Slo] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.profiles = dict(profiles or {})
        self.slos = dict(slos or {})
        self.clock = clock
        self._rng = rng or random.Random()
        self.in_flight: dict[str, dict[str, Tracked]] = {}
        """Per node session: this ingress's requests there, by request id."""
        self.on_overload: Callable[[str], None] | None = None
        """Told the model when no replica validates (the gateway asks a controller for another instance)."""
        self.refused = 0
        """Picks where no replica validated."""

    @classmethod
    def from_config(cls, config: Any, **options: Any) -> SloHeadroomPolicy:
        """Built from the gateway's `profiles_dir` and `slos`."""
        return cls(load_profiles(config.profiles_dir), parse_slos(config.slos), **options)

    def __repr__(self) -> str:
        return f"<SloHeadroomPolicy profiles={len(self.profiles)} refused={self.refused}>"

    def slo_for(self, model: str, input_tokens: int) -> Slo:
        """The SLOs a request of `model` is held to."""
        return self.slos.get(model) or Slo.llm_mesh(input_tokens)

    def profile_of(self, record: NodeRecord, model: str) -> PerformanceProfile | None:
        """The profile the replica of `model` on `record` runs under, if this ingress has it."""
        for entry in record.models:
            if entry.id == model:
                return self.profiles.get(str(entry.settings.get("profile", "")))
        return None

    def instances(self, record: NodeRecord, now: float) -> tuple[dict[str, InstanceLoad], int]:
        """The node's instances with a known profile, rebuilt from this ingress's requests there."""
        out: dict[str, InstanceLoad] = {}
        for entry in record.models:
            profile = self.profiles.get(str(entry.settings.get("profile", "")))
            if profile is not None:
                out[entry.id] = InstanceLoad(profile)
        requests = self.in_flight.get(record.session_id, {})
        for tracked in requests.values():
            inst = out.get(tracked.model)
            if inst is not None:
                inst.requests.append(RequestState(tracked.start, tracked.slo, tracked.input_tokens))
        for inst in out.values():
            _estimate_progress(inst, now)
        return out, len(requests)

    def pick(self, candidates: Sequence[NodeRecord], request: RoutedRequest) -> NodeRecord:
        """A replica that validates (CPU first, then the largest batch), else the least loaded."""
        now = self.clock()
        new = RequestState(
            now, self.slo_for(request.model, request.input_tokens), max(1, request.input_tokens)
        )
        passing: list[tuple[int, int, float, NodeRecord]] = []
        for record in candidates:
            instances, _ = self.instances(record, now)
            target = instances.get(request.model)
            if target is None:
                continue
            names = list(instances)
            verdict = shadow_validate([instances[n] for n in names], names.index(request.model), new, now)
            if verdict.ok:
                gpu = 1 if record.hardware.get("gpus") else 0
                passing.append((gpu, -len(target.requests), self._rng.random(), record))
        if passing:
            return min(passing, key=lambda p: p[:3])[3]
        self.refused += 1
        if self.on_overload is not None:
            self.on_overload(request.model)
        return min(candidates, key=lambda r: (len(self.in_flight.get(r.session_id, {})), self._rng.random()))

    def on_request_start(self, target: NodeRecord, request: RoutedRequest) -> None:
        """Track the request on its node."""
        slo = self.slo_for(request.model, request.input_tokens)
        tracked = Tracked(request.model, self.clock(), max(1, request.input_tokens), slo)
        self.in_flight.setdefault(target.session_id, {})[request.request_id] = tracked

    def on_request_end(
        self, target: NodeRecord, request: RoutedRequest, *, ok: bool, latency_s: float
    ) -> None:
        """Forget it; nodes with nothing in flight leave the table."""
        requests = self.in_flight.get(target.session_id)
        if requests is not None:
            requests.pop(request.request_id, None)
            if not requests:
                del self.in_flight[target.session_id]


def _estimate_progress(inst: InstanceLoad, now: float) -> None:
    """Tokens each request has produced by `now`, as its profile says: its prefill, then a decode iteration each."""
    if not inst.requests:
        return
    decode = inst.decode_round() or 1e-3
    for r in inst.requests:
        into_decode = now - r.start - inst.profile.prefill_time(r.input_tokens)
        r.output_tokens = 0 if into_decode < 0 else 1 + int(into_decode / decode)
