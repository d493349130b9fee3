"""What every route of the frontend shares: configuration, database, key store, ledger, trace recorder and ingress
client."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from opentela.frontend._config import FrontendConfig
from opentela.frontend.db import Database
from opentela.frontend.ingress import Ingress
from opentela.frontend.keys import KeyStore
from opentela.frontend.trace_recorder import TraceRecorder
from opentela.frontend.usage import UsageLedger


@dataclass
class FrontendState:
    """The frontend's long-lived parts, reachable from a request as `request.app.state.frontend`."""

    config: FrontendConfig
    db: Database
    keys: KeyStore
    ledger: UsageLedger
    ingress: Ingress
    admin_token: str
    trace: TraceRecorder


def state_of(request: Request) -> FrontendState:
    """The shared state of the app serving `request`."""
    return request.app.state.frontend


def bearer_token(request: Request) -> str | None:
    """The token of an `Authorization: Bearer ...` header (or an `api-key` header, as some SDKs send)."""
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return request.headers.get("api-key") or None
