"""Trust: the providers a request accepts, from its header, its body and the ingress default."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from opentela.errors import InvalidRequestError
from opentela.registry.record import NodeRecord

TRUST_HEADER = "X-Otela-Trusted-Providers"


def parse_providers(value: Any, where: str) -> frozenset[str] | None:
    """A provider list given as ``"a,b"`` or ``["a", "b"]``; None when absent or blank (no opinion)."""
    if value is None:
        return None
    if isinstance(value, str):
        items = [p.strip() for p in value.split(",")]
    elif isinstance(value, list) and all(isinstance(p, str) for p in value):
        items = [p.strip() for p in value]
    else:
        raise InvalidRequestError(
            f"{where} must be a comma-separated string or a list of strings", param=where
        )
    names = frozenset(p for p in items if p)
    return names or None


def resolve_allowlist(header: str | None, body: Any, default: Iterable[str] = ()) -> frozenset[str] | None:
    """The providers this request trusts, or None for any.

    Header and body each narrow the choice (both given: only providers named in both); the ingress default
    applies when the request names none.
    """
    given = [
        names
        for names in (
            parse_providers(header, TRUST_HEADER),
            parse_providers(body, "metadata.trusted_providers"),
        )
        if names is not None
    ]
    if not given:
        return frozenset(default) or None
    allow = given[0]
    for names in given[1:]:
        allow &= names
    return allow


def trusted(candidates: Sequence[NodeRecord], allowlist: frozenset[str] | None) -> list[NodeRecord]:
    """The candidates whose provider is on the allowlist (all of them when there is none)."""
    if allowlist is None:
        return list(candidates)
    return [c for c in candidates if c.provider_id in allowlist]
