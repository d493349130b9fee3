"""What every route of the gateway shares, reached from a request through one accessor (routes never import
the app), and the typed keys aiohttp stores it and per-request values under."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from opentela.gateway._config import GatewayConfig
from opentela.gateway.forwarder import Forwarder
from opentela.gateway.hold import ColdStartHold
from opentela.gateway.mesh import Mesh
from opentela.gateway.metrics import GatewayMetrics
from opentela.gateway.routing import Router
from opentela.gateway.split_models import SplitModels


@dataclass(frozen=True, slots=True)
class GatewayState:
    """The gateway's long-lived parts: configuration, the node's mesh view, routing, dispatch and metrics."""

    config: GatewayConfig
    mesh: Mesh
    router: Router
    forwarder: Forwarder
    metrics: GatewayMetrics
    hold: ColdStartHold
    split: SplitModels

    @classmethod
    def build(cls, mesh: Mesh, config: GatewayConfig) -> GatewayState:
        """Compose the parts over `mesh`; no I/O."""
        metrics = GatewayMetrics()
        router = Router(mesh, config)
        forwarder = Forwarder(config, router, mesh.open_http_stream, metrics, mesh.report_failure)
        hold = ColdStartHold(mesh, config)
        for policy in router.policies.values():
            if hasattr(policy, "on_overload"):
                policy.on_overload = hold.scale_out  # e.g. slo_headroom, when no replica can take more
        return cls(config, mesh, router, forwarder, metrics, hold, SplitModels(mesh, config))


STATE_KEY: web.AppKey[GatewayState] = web.AppKey("otela_gateway", GatewayState)

# aiohttp 3.13 added typed request storage keys and warns about plain strings; older versions take strings.
REQUEST_ID_KEY: Any = web.RequestKey("request_id", str) if hasattr(web, "RequestKey") else "request_id"
CALL_KEY: Any = web.RequestKey("otela_call", object) if hasattr(web, "RequestKey") else "otela_call"
"""The inference call a request became (model, attempts, policy), for the access log."""


def state_of(request: web.Request) -> GatewayState:
    """The shared state of the gateway serving `request`."""
    return request.app[STATE_KEY]
