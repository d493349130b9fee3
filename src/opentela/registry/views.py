"""Node and model views derived from the CRDT, kept up to date on every applied record for O(1) lookups."""

from __future__ import annotations

from opentela._types import Lifecycle, SessionId
from opentela.registry.record import NodeRecord


class RegistryViews:
    """model id -> serving records, plus the set of models ever served; updated incrementally."""

    def __init__(self) -> None:
        self._serving: dict[str, dict[SessionId, NodeRecord]] = {}
        self._known_models: set[str] = set()
        # Cached candidate lists, rebuilt only when a model's replica set changes: the request path reads these.
        self._lists: dict[str, list[NodeRecord]] = {}

    def __repr__(self) -> str:
        return f"<RegistryViews models={len(self._serving)} known={len(self._known_models)}>"

    def update(self, old: NodeRecord | None, new: NodeRecord | None) -> None:
        """Account for `new` replacing `old` under the same key (`new` None: the key was compacted away)."""
        if old is not None and old.lifecycle is Lifecycle.SERVING:
            for model in old.model_ids:
                replicas = self._serving.get(model)
                if replicas is not None and replicas.pop(old.session_id, None) is not None:
                    self._touch(model)
        if new is None:
            return
        self._known_models.update(new.model_ids)
        if new.lifecycle is Lifecycle.SERVING:
            for model in new.model_ids:
                self._serving.setdefault(model, {})[new.session_id] = new
                self._touch(model)

    def _touch(self, model: str) -> None:
        replicas = self._serving.get(model)
        if replicas:
            self._lists[model] = list(replicas.values())
        else:
            self._serving.pop(model, None)
            self._lists.pop(model, None)

    def forget_models_except(self, models: set[str]) -> None:
        """Keep only `models` (and those served now) as known: the garbage collector's trim."""
        self._known_models = (self._known_models & models) | set(self._serving)

    def candidates(self, model: str) -> list[NodeRecord]:
        """SERVING records of `model` (a cached list; do not mutate)."""
        return self._lists.get(model, [])

    def model_replicas(self) -> dict[str, list[NodeRecord]]:
        """Every model with at least one SERVING record."""
        return {m: list(v) for m, v in self._lists.items()}

    def known_models(self) -> set[str]:
        """Every model any record has ever announced, including ones whose nodes went DOWN."""
        return set(self._known_models)
