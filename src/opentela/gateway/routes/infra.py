"""Read-only views of the local registry replica: models, table, peers, bootstraps, stats, health, metrics."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from opentela.gateway.state import GatewayState, state_of
from opentela.registry.record import REPLICA_SERVING, ModelEntry, NodeRecord


def _hardware_summary(record: NodeRecord) -> dict[str, Any]:
    hw = record.hardware or {}
    gpus = hw.get("gpus") or []
    cpu = hw.get("cpu") or {}
    return {
        "gpus": [
            {"name": g.get("name"), "memory_mib": g.get("memory_mib")} for g in gpus if isinstance(g, dict)
        ],
        "cpu": cpu.get("model"),
        "cpu_threads": cpu.get("threads"),
        "ram_mib": hw.get("ram_mib"),
    }


def _replica(gw: GatewayState, record: NodeRecord, model: str) -> dict[str, Any]:
    entry = next((m for m in record.models if m.id == model), None)
    return {
        "session_id": record.session_id,
        "peer_id": record.peer_id,
        "provider_id": record.provider_id,
        "state": record.lifecycle.name,
        "suspected": gw.mesh.is_suspected(record.peer_id),
        "engine": entry.engine if entry else "",
        "settings": dict(entry.settings) if entry else {},
        "hardware": _hardware_summary(record),
        **_replica_state(entry),
    }


def _replica_state(entry: ModelEntry | None) -> dict[str, Any]:
    """`replica_state` (`serving`, `reconfiguring`, or another state the engine names), and a tensor-parallel
    engine's `tp_degree` and `tp_ranks` (the healthy ranks as a list) where it advertises them; a malformed value
    is left out, not guessed at."""
    if entry is None:
        return {"replica_state": REPLICA_SERVING}
    out: dict[str, Any] = {"replica_state": entry.replica_state}
    degree = entry.settings.get("tp_degree")
    if isinstance(degree, int) and not isinstance(degree, bool) and degree > 0:
        out["tp_degree"] = degree
    ranks = entry.settings.get("tp_ranks")
    if isinstance(ranks, str):
        parts = [p.strip() for p in ranks.split(",") if p.strip()]
        if parts and all(p.isascii() and p.isdigit() for p in parts):
            out["tp_ranks"] = [int(p) for p in parts]
    return out


def model_objects(gw: GatewayState) -> list[dict[str, Any]]:
    """Every model a request may name, in OpenAI's model shape: served ids with their replicas, split models
    with their block servers, then aliases (`alias_for` the id, with its replicas); `default: true` marks the
    default model."""
    names = gw.router.names
    shadowed = names.aliases.keys() | names.retired.keys()  # requests for these names never reach a replica
    data = []
    for model, records in sorted(gw.mesh.model_replicas().items()):
        if model in shadowed:
            continue
        data.append(
            {
                "id": model,
                "object": "model",
                "created": int(min(r.started_at for r in records)),
                "owned_by": "opentela",
                "replicas": [_replica(gw, r, model) for r in records],
            }
        )
    whole = {m["id"] for m in data}
    for model, records in sorted(gw.split.served().items()):
        if model in whole or model in shadowed:
            continue  # served whole somewhere: requests go to those replicas
        data.append(
            {
                "id": model,
                "object": "model",
                "created": int(min(r.started_at for r in records)),
                "owned_by": "opentela",
                "split": True,
                "block_servers": [_block_server(gw, r, model) for r in records],
            }
        )
    by_id = {m["id"]: m for m in data}
    for alias, target in sorted(names.aliases.items()):
        served = by_id.get(target)
        if served is None:
            continue  # nothing serves its target now: the alias would only lead to a 404
        entry = {**served, "id": alias, "alias_for": target}
        data.append(entry)
    default = names.default
    for m in data:
        if m["id"] == default:
            m["default"] = True
    return data


async def list_models(request: web.Request) -> web.Response:
    """GET /v1/models: the model registry view in OpenAI's shape, with each model's replicas, and the aliases."""
    return web.json_response({"object": "list", "data": model_objects(state_of(request))})


async def get_model(request: web.Request) -> web.Response:
    """GET /v1/models/{id}: one model object (ids may hold slashes); 404 in OpenAI's shape, with close names,
    when nothing by that name is served."""
    gw = state_of(request)
    name = request.match_info["model"]
    data = model_objects(gw)
    found = next((m for m in data if m["id"] == name), None)
    if found is None:
        raise gw.router.names.unknown(name, (m["id"] for m in data if "alias_for" not in m))
    return web.json_response(found)


def _block_server(gw: GatewayState, record: NodeRecord, model: str) -> dict[str, Any]:
    spans = [s for s in record.blocks if s.model == model]
    return {
        "session_id": record.session_id,
        "peer_id": record.peer_id,
        "provider_id": record.provider_id,
        "suspected": gw.mesh.is_suspected(record.peer_id),
        "blocks": [[s.start, s.end] for s in spans],
        "total_blocks": spans[0].total if spans else 0,
        "block_ms": spans[0].block_ms if spans else 0.0,
        "hardware": _hardware_summary(record),
    }


async def dnt_names(request: web.Request) -> web.Response:
    """GET /v1/dnt/names: the alias table, retired names and default model (small; frontends cache it)."""
    names = state_of(request).router.names
    return web.json_response(
        {
            "aliases": names.aliases,
            "retired": [
                {"id": r.name, "replacement": r.replacement or None, "message": r.message or None}
                for r in sorted(names.retired.values(), key=lambda r: r.name)
            ],
            "default_model": names.default or None,
        }
    )


async def dnt_table(request: web.Request) -> web.Response:
    """GET /v1/dnt/table: every record of the local replica."""
    return web.json_response(state_of(request).mesh.table())


async def dnt_peers(request: web.Request) -> web.Response:
    """GET /v1/dnt/peers: connected peers and their liveness as this node sees them."""
    return web.json_response(state_of(request).mesh.peers())


async def dnt_rtt(request: web.Request) -> web.Response:
    """GET /v1/dnt/rtt: this node's measured round trips to live peers in ms, ``{self: {peer: ms}}``."""
    return web.json_response(state_of(request).mesh.rtt())


async def dnt_bootstraps(request: web.Request) -> web.Response:
    """GET /v1/dnt/bootstraps: where this node bootstrapped from and where others can bootstrap from it."""
    return web.json_response(state_of(request).mesh.bootstraps())


async def dnt_serverless(request: web.Request) -> web.Response:
    """GET /v1/dnt/serverless: the serverless models a controller starts on demand, and their state."""
    return web.json_response({"models": await state_of(request).hold.catalog_state()})


async def dnt_stats(request: web.Request) -> web.Response:
    """GET /v1/dnt/stats: registry, gossip, fabric and gateway counters, and the node's notices."""
    gw = state_of(request)
    stats = gw.mesh.stats()
    stats["gateway"] = {
        "retries": gw.forwarder.retries,
        "policy": gw.config.policy,
        "request_policies": sorted(gw.router.policies),
        "cooldowns": gw.router.health.cooldowns,
        "cooling": gw.router.health.cooling(),
        # Policies that keep counters (prefix_affinity's hits, moves and misses) show them here.
        "policy_stats": {
            name: counters()
            for name, policy in gw.router.policies.items()
            if callable(counters := getattr(policy, "stats", None))
        },
    }
    if gw.split.any_served():
        stats["split_models"] = gw.split.stats()
    return web.json_response(stats)


async def health(request: web.Request) -> web.Response:
    """GET /v1/health: liveness of this node and the notices (warnings) it has up."""
    return web.json_response(state_of(request).mesh.health())


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text format."""
    body = state_of(request).metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
