"""Plugin registries: named engines, routing policies and placement policies, one `Registry` per kind.

This module sits below every layer package and imports none of them: each package creates its own
instance (``ENGINES``, the gateway's and the scheduler's ``POLICIES``) and names its built-in modules.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

from opentela.errors import PluginError

log = logging.getLogger(__name__)

T = TypeVar("T")


class Registry(Generic[T]):
    """Named plugins of one kind, keyed by the lowercase name used in configuration.

    Plugins register with a decorator beside their class; registering a name twice raises instead of
    silently replacing the first. Built-in plugins are imported explicitly, by module path, on the first
    lookup, so what is registered never depends on which module happened to be imported first.
    Operators' plugins load from an entry-point group or by an import path ``package.module:Name``.
    Every mistake (unknown name, duplicate, bad import path) raises `PluginError`.
    """

    def __init__(self, kind: str, builtins: Sequence[str] = (), entry_point_group: str | None = None) -> None:
        self.kind = kind
        self._builtins = tuple(builtins)
        self._group = entry_point_group
        self._items: dict[str, T] = {}
        self._loaded = False
        self._lock = threading.RLock()

    def register(self, name: str | None = None) -> Callable[[T], T]:
        """Class decorator: register under `name`, or under the class's own ``name`` attribute."""

        def decorator(obj: T) -> T:
            self.add(name or str(getattr(obj, "name", "") or ""), obj)
            return obj

        return decorator

    def add(self, name: str, obj: T) -> None:
        """Register `obj` under `name` (case-insensitive); an empty or taken name raises PluginError."""
        key = name.strip().lower()
        if not key:
            raise PluginError(f"a {self.kind} needs a non-empty name to be registered: {obj!r}")
        with self._lock:
            if key in self._items:
                raise PluginError(f"{self.kind} {key!r} is already registered as {self._items[key]!r}")
            self._items[key] = obj

    def get(self, name: str) -> T:
        """Look a plugin up by name, or import it from ``package.module:Name``."""
        if ":" in name:
            return self._import_path(name)
        self._ensure_loaded()
        try:
            return self._items[name.strip().lower()]
        except KeyError:
            known = ", ".join(self.names()) or "none"
            raise PluginError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        self._ensure_loaded()
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        self._ensure_loaded()
        return isinstance(name, str) and name.strip().lower() in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"<Registry {self.kind} {sorted(self._items)}>"

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            # Set first: a built-in module that looks something up while importing must not recurse.
            self._loaded = True
            for module in self._builtins:
                importlib.import_module(module)
            if self._group:
                self._load_entry_points(self._group)

    def _load_entry_points(self, group: str) -> None:
        for ep in importlib.metadata.entry_points(group=group):
            try:
                obj = ep.load()
            except Exception:
                # One broken third-party package must not take every other plugin of its kind down with it.
                log.exception("could not load %s plugin %r from %s", self.kind, ep.name, ep.value)
                continue
            # A plugin module may already have registered itself with the decorator when loaded.
            if self._items.get(ep.name.lower()) is not obj:
                self.add(ep.name, obj)

    def _import_path(self, path: str) -> T:
        module_name, _, attr = path.partition(":")
        try:
            obj: T = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise PluginError(f"cannot load {self.kind} from {path!r}: {exc}") from exc
        return obj
