"""Which replicas may serve a request: healthy, then trusted, then meeting its constraints, then not cooling."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentela.errors import (
    InvalidRequestError,
    NoHealthyReplicaError,
    NoTrustedProviderError,
    OpenTelaError,
    UnmetConstraintError,
)
from opentela.gateway._config import GatewayConfig
from opentela.gateway.constraints import (
    REQUIRE_HEADER,
    Constraint,
    describe_observed,
    model_entry,
    parse_constraints,
    satisfying,
)
from opentela.gateway.cooldown import ReplicaHealth
from opentela.gateway.mesh import Mesh
from opentela.gateway.policies import RoutedRequest, RoutingPolicy, create_policy
from opentela.gateway.trust import TRUST_HEADER, resolve_allowlist, trusted
from opentela.registry.record import REPLICA_SERVING, NodeRecord

POLICY_HEADER = "X-Otela-Policy"
OTELA_METADATA_KEYS = ("trusted_providers", "require", "policy")
"""Keys of the body's `metadata` object that are addressed to the ingress, not to the engine."""


def newest_per_peer(pool: Sequence[NodeRecord]) -> Sequence[NodeRecord]:
    """Drop records superseded by a newer session of the same peer.

    A restarted node rejoins under a new session with the same peer id, and the stream to that peer reaches
    whichever session runs now; until the old record is evicted it would route to the new process, maybe
    before its engine is ready.
    """
    if len(pool) < 2:
        return pool
    newest: dict[str, NodeRecord] = {}
    for r in pool:
        seen = newest.get(r.peer_id)
        if seen is None or r.started_at > seen.started_at:
            newest[r.peer_id] = r
    if len(newest) == len(pool):
        return pool
    return [r for r in pool if newest[r.peer_id] is r]


def prefer_serving(pool: Sequence[NodeRecord], model: str) -> Sequence[NodeRecord]:
    """The replicas in `pool` whose entry for `model` is serving; all of `pool` when none is.

    A reconfiguring replica (a tensor-parallel engine moving onto the ranks it has left) still holds its streams
    and queues new requests until it serves again, so it takes new work only when nothing else can: the request
    then waits there instead of failing. Any other state an engine advertises (`starting`) is treated alike.
    """
    kept = [r for r in pool if _serving(r, model)]
    return pool if not kept or len(kept) == len(pool) else kept


def _serving(record: NodeRecord, model: str) -> bool:
    entry = model_entry(record, model)
    return entry is None or entry.replica_state == REPLICA_SERVING


@dataclass(frozen=True, slots=True)
class RequestRouting:
    """What one request asks of routing."""

    allowlist: frozenset[str] | None
    constraints: tuple[Constraint, ...]
    policy: RoutingPolicy
    policy_name: str


class Router:
    """Holds the ingress's policies and health view, and turns a request into its eligible replicas."""

    def __init__(self, mesh: Mesh, config: GatewayConfig, health: ReplicaHealth | None = None) -> None:
        self.mesh = mesh
        self.config = config
        self.health = health or ReplicaHealth(config.cooldown_failures, config.cooldown_seconds)
        self.names = config.model_names()
        """Aliases, retired names and the default model (gateway/model_names.py)."""
        self.default_policy = create_policy(config.policy, config)
        self.policies: dict[str, RoutingPolicy] = {config.policy.lower(): self.default_policy}
        for name in config.request_policies:
            self.policies.setdefault(name.lower(), create_policy(name, config))
        self._hooks = tuple(self.policies.values())
        self.uses_prefix = any(getattr(p, "uses_prefix", False) for p in self._hooks)
        """Whether requests need their prompt's prefix digests: only while a policy reads them."""
        self._default_routing = RequestRouting(
            frozenset(config.trusted_providers) or None, (), self.default_policy, config.policy.lower()
        )

    def routing_for(self, headers: Mapping[str, str], metadata: Mapping[str, Any] | None) -> RequestRouting:
        """Read the trust list, constraints and policy choice from the headers and the body's metadata."""
        trust_header = headers.get(TRUST_HEADER)
        require_header = headers.get(REQUIRE_HEADER)
        policy_header = headers.get(POLICY_HEADER)
        if metadata is None and trust_header is None and require_header is None and policy_header is None:
            return self._default_routing  # the common case costs three dictionary misses
        metadata = metadata or {}
        allowlist = resolve_allowlist(
            trust_header, metadata.get("trusted_providers"), self.config.trusted_providers
        )
        constraints = parse_constraints(require_header) + parse_constraints(
            metadata.get("require"), "metadata.require"
        )
        name = self._policy_name(policy_header or metadata.get("policy"))
        return RequestRouting(allowlist, constraints, self.policies[name], name)

    def _policy_name(self, name: Any) -> str:
        if name is None or name == "":
            return self._default_routing.policy_name
        key = str(name).lower()
        if key not in self.policies:
            allowed = ", ".join(sorted(self.policies))
            raise InvalidRequestError(
                f"routing policy {name!r} cannot be chosen per request on this ingress; allowed: {allowed}",
                param="policy",
            )
        return key

    def eligible(self, model: str, routing: RequestRouting) -> Sequence[NodeRecord]:
        """The replicas this request may go to now: a handful of local reads, no I/O."""
        pool: Sequence[NodeRecord] = newest_per_peer(self.mesh.candidates(model))
        if routing.allowlist is not None:
            pool = trusted(pool, routing.allowlist)
        if routing.constraints:
            pool, _ = satisfying(pool, model, routing.constraints)
        return self.health.available(pool)

    def explain_empty(self, model: str, routing: RequestRouting) -> OpenTelaError:
        """Why `eligible` came back empty, as the error the client gets."""
        healthy = self.mesh.candidates(model)
        if not healthy:
            if model in self.mesh.known_model_ids():
                return NoHealthyReplicaError(
                    f"model {model!r} is known but no healthy replica serves it right now"
                )
            return self.names.unknown(model, self.mesh.model_replicas())
        pool = trusted(healthy, routing.allowlist)
        if not pool:
            serving = ", ".join(sorted({c.provider_id for c in healthy}))
            names = ", ".join(sorted(routing.allowlist or ()))
            return NoTrustedProviderError(
                f"no trusted provider serves model {model!r}: trusted [{names}], serving [{serving}]"
            )
        _, unmet = satisfying(pool, model, routing.constraints)
        if unmet is not None:
            return UnmetConstraintError(
                f"no replica of model {model!r} meets the constraint {unmet} "
                f"(replicas offer {unmet.key}: {describe_observed(pool, model, unmet)})",
                param=unmet.key,
            )
        return NoHealthyReplicaError(f"no replica of model {model!r} can take the request now")

    def started(self, target: NodeRecord, request: RoutedRequest) -> None:
        """Every policy hears every start, so load counts hold whichever policy picked."""
        for policy in self._hooks:
            policy.on_request_start(target, request)

    def ended(self, target: NodeRecord, request: RoutedRequest, *, ok: bool, latency_s: float) -> None:
        """Every policy hears every end."""
        for policy in self._hooks:
            policy.on_request_end(target, request, ok=ok, latency_s=latency_s)
