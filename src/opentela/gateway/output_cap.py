"""The most output tokens a request may ask of a model: its context length, unless the operator set a cap.

Without a cap, one request with ``max_tokens: 10**12`` keeps a replica's slot busy for as long as the engine lets
it run; no engine can produce more tokens than its context window holds, so asking for more is refused at the
door with a 400 instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentela.errors import InvalidRequestError
from opentela.gateway.constraints import model_entry
from opentela.registry.record import NodeRecord

OUTPUT_PARAMS = ("max_completion_tokens", "max_tokens")
"""The body fields that bound a request's output, in the order OpenAI gives them precedence."""


def requested_output(body: Mapping[str, Any]) -> tuple[str, float] | None:
    """(field, value) of every output bound the body sets as a number; the largest one, when there are two."""
    asked: tuple[str, float] | None = None
    for name in OUTPUT_PARAMS:
        value = body.get(name)
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and (asked is None or value > asked[1])
        ):
            asked = (name, value)
    return asked


def context_length(record: NodeRecord, model: str) -> int | None:
    """The context window a replica advertises for `model`, if it advertises one."""
    entry = model_entry(record, model)
    if entry is None:
        return None
    value = entry.settings.get("context_length", entry.settings.get("max_model_len"))
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


class OutputCap:
    """Refuses requests that ask a model for more output tokens than it can produce."""

    def __init__(self, fallback: int, overrides: Mapping[str, int] | None = None) -> None:
        self.fallback = fallback
        self.overrides = dict(overrides or {})

    def limit(self, model: str, replicas: Sequence[NodeRecord]) -> tuple[int, str]:
        """The cap for `model` among `replicas`, and where it comes from (for the error message).

        The largest window among the replicas counts: a request that fits one of them is not refused here. A
        replica that advertises none counts as `fallback`.
        """
        if model in self.overrides:
            return self.overrides[model], "the ingress's cap for this model"
        windows = [context_length(r, model) for r in replicas]
        known = [w for w in windows if w is not None]
        if known and len(known) == len(windows):
            return max(known), "the largest context length its replicas advertise"
        return max([*known, self.fallback]), "the ingress's cap for models of unknown context length"

    def check(self, model: str, asked: tuple[str, float] | None, replicas: Sequence[NodeRecord]) -> None:
        """Raise a 400 naming the field when the request asks for more output than `model` allows."""
        if asked is None:
            return
        name, value = asked
        if model in self.overrides:
            fits = value <= self.overrides[model]
        else:  # stops at the first replica that fits: one look for almost every request
            fits = any(value <= (context_length(r, model) or self.fallback) for r in replicas)
        if fits:
            return
        cap, source = self.limit(model, replicas)
        if value > cap:
            raise InvalidRequestError(
                f"`{name}` is {value} but model {model!r} can produce at most {cap} tokens ({source})",
                param=name,
            )
