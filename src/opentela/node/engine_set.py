"""The engines of one node: one EngineRunner per engine, keyed by name and port, each its own replica."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

from opentela.engines.base import EngineSpec
from opentela.node.engine_client import EngineTarget
from opentela.node.engine_runner import EngineRunner
from opentela.registry.record import ModelEntry

RunnerFactory = Callable[[EngineSpec, Path, bool], EngineRunner]
Spawn = Callable[[Coroutine[Any, Any, Any], str], Any]


class EngineSet:
    """Launches runners with a log file each, tells the proxy where a serving engine is, stops them all.

    `make_runner(spec, log_path, assigned)` builds a runner wired to the node's callbacks; `spawn` runs its
    `run()` among the node's tasks.
    """

    def __init__(self, log_dir: Callable[[], Path], make_runner: RunnerFactory, spawn: Spawn) -> None:
        self._log_dir = log_dir
        self._make_runner = make_runner
        self._spawn = spawn
        self.runners: dict[str, EngineRunner] = {}

    def __repr__(self) -> str:
        return f"<EngineSet {', '.join(self.runners) or 'idle'}>"

    def __len__(self) -> int:
        return len(self.runners)

    def __iter__(self) -> Iterator[EngineRunner]:
        return iter(list(self.runners.values()))

    @property
    def first(self) -> EngineRunner | None:
        """The engine started first (the only one on most nodes)."""
        return next(iter(self.runners.values()), None)

    def log_path(self, spec: EngineSpec, session_id: str) -> Path:
        """Where a new engine's output goes: one file per session, and per port beside another engine."""
        log_dir = self._log_dir()
        log_dir.mkdir(parents=True, exist_ok=True)
        path = log_dir / f"engine-{session_id[:12]}.log"
        if any(r.log_path == path for r in self.runners.values()):
            path = log_dir / f"engine-{session_id[:12]}-{spec.port}.log"
        return path

    def launch(
        self,
        spec: EngineSpec,
        session_id: str,
        *,
        assigned: bool,
        model: str = "",
        memory_mib: int | None = None,
        profile: str = "",
        keep_alive_s: float | None = None,
    ) -> EngineRunner:
        """Start running `spec` in the background (for `model`, taking `memory_mib` of the node's engine memory,
        under performance profile `profile`); a second engine with the same key is refused."""
        runner = self._make_runner(spec, self.log_path(spec, session_id), assigned)
        runner.assigned_model, runner.memory_mib, runner.profile = model, memory_mib, profile
        runner.keep_alive_s = keep_alive_s
        if runner.key in self.runners:
            raise ValueError(f"engine {runner.key} already runs on this node")
        self.runners[runner.key] = runner
        self._spawn(runner.run(), "engine")
        return runner

    def forget(self, runner: EngineRunner) -> None:
        """Drop a runner that stopped its engine for good (an assignment that never served)."""
        if self.runners.get(runner.key) is runner:
            del self.runners[runner.key]

    def serving_url(self, model: str | None = None) -> str | None:
        """The base URL of an engine that serves `model` now (any serving engine when None or when only one
        engine runs), or None."""
        target = self.serving_target(model)
        return target.base_url if target is not None else None

    def serving_target(self, model: str | None = None) -> EngineTarget | None:
        """Where to reach an engine that serves `model` now (as `serving_url` picks it), or None."""
        for r in self.runners.values():
            if r.ready and (model is None or len(self.runners) == 1 or any(m.id == model for m in r.models)):
                return EngineTarget(r.spec.base_url, r.spec.unix_socket)
        return None

    def serving_models(self) -> tuple[ModelEntry, ...]:
        """The model entries of every engine that serves now, for the node's record."""
        return tuple(m for r in self.runners.values() if r.ready for m in r.models)

    def retire(self) -> None:
        """The node is going down: every engine refuses requests at once and reports nothing more."""
        for runner in self.runners.values():
            runner.retire()

    async def aclose(self) -> None:
        """Stop every engine."""
        for runner in list(self.runners.values()):
            await runner.aclose()
