"""Model names at the ingress: aliases for served ids, retired names, the default model, and close-name hints.

Users and client code name models by short or old names (`llama-3.3-70b`), while replicas serve a full id
(`meta-llama/Llama-3.3-70B-Instruct`). The operator's table maps one to the other before routing, so policies,
metrics and usage always see the id that was served. A retired name answers 404 naming its replacement, and a
name nobody serves answers 404 with the closest names that exist.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from opentela.errors import ConfigError, ModelNotFoundError

SUGGESTIONS = 3
"""Close names an unknown-model error offers at most."""
SUGGESTION_CUTOFF = 0.6
"""How alike two names must be (difflib's ratio) to be offered as a suggestion."""
LISTED = 20
"""Served models an unknown-model error lists at most."""


@dataclass(frozen=True, slots=True)
class Retired:
    """A name that is no longer served: what to use instead (may be empty) and the operator's note."""

    name: str
    replacement: str = ""
    message: str = ""

    def error(self) -> ModelNotFoundError:
        """The 404 a request naming this model gets."""
        text = f"model {self.name!r} has been retired"
        if self.replacement:
            text += f"; use {self.replacement!r} instead"
        if self.message:
            text += f" ({self.message})"
        return ModelNotFoundError(text, param="model", replacement=self.replacement or None)


def parse_aliases(entries: Iterable[str]) -> dict[str, str]:
    """`ALIAS=ID` entries as a mapping; a ConfigError names a malformed entry."""
    out: dict[str, str] = {}
    for entry in entries:
        alias, sep, target = entry.partition("=")
        alias, target = alias.strip(), target.strip()
        if not sep or not alias or not target:
            raise ConfigError(f"model_aliases entries are ALIAS=MODEL_ID, got {entry!r}")
        if alias == target:
            raise ConfigError(f"model alias {alias!r} points at itself")
        if out.get(alias, target) != target:
            raise ConfigError(f"model alias {alias!r} is given twice, for {out[alias]!r} and {target!r}")
        out[alias] = target
    return out


def parse_retired(entries: Iterable[str]) -> dict[str, Retired]:
    """`NAME[=REPLACEMENT][|MESSAGE]` entries as a mapping; a ConfigError names a malformed entry."""
    out: dict[str, Retired] = {}
    for entry in entries:
        head, _, message = entry.partition("|")
        name, _, replacement = head.partition("=")
        name, replacement = name.strip(), replacement.strip()
        if not name:
            raise ConfigError(f"retired_models entries are NAME[=REPLACEMENT][|MESSAGE], got {entry!r}")
        out[name] = Retired(name, replacement, message.strip())
    return out


class ModelNames:
    """Resolves the model a request names to the id replicas serve (pure; no I/O, no clock)."""

    def __init__(
        self,
        aliases: Mapping[str, str] | None = None,
        retired: Mapping[str, Retired] | None = None,
        default: str = "",
    ) -> None:
        self.aliases = dict(aliases or {})
        self.retired = dict(retired or {})
        self.default = default.strip()
        chained = sorted(a for a, t in self.aliases.items() if t in self.aliases or t in self.retired)
        if chained:
            raise ConfigError(
                f"model aliases must point at served ids, not at other names: {', '.join(chained)}"
            )
        both = sorted(set(self.aliases) & set(self.retired))
        if both:
            raise ConfigError(f"names both aliased and retired: {', '.join(both)}")
        if self.default in self.retired:
            raise ConfigError(f"the default model {self.default!r} is retired")

    @classmethod
    def from_entries(cls, aliases: Iterable[str], retired: Iterable[str], default: str = "") -> ModelNames:
        """Build from the configuration's entry lists (gateway.model_aliases, retired_models, default_model)."""
        return cls(parse_aliases(aliases), parse_retired(retired), default)

    def __repr__(self) -> str:
        return (
            f"<ModelNames aliases={len(self.aliases)} retired={len(self.retired)} default={self.default!r}>"
        )

    def __bool__(self) -> bool:
        return bool(self.aliases or self.retired or self.default)

    def resolve(self, name: str | None) -> str | None:
        """The served id `name` stands for (itself when it is no alias); the default model when `name` is
        missing or empty (None when there is none). A retired name raises its 404."""
        if name is None or (isinstance(name, str) and not name.strip()):
            return self.aliases.get(self.default, self.default) or None
        if not isinstance(name, str):
            return name
        retired = self.retired.get(name)
        if retired is not None:
            raise retired.error()
        return self.aliases.get(name, name)

    def aliases_of(self, served: str) -> list[str]:
        """The aliases pointing at `served`, sorted."""
        return sorted(a for a, t in self.aliases.items() if t == served)

    def unknown(self, name: str, served: Iterable[str]) -> ModelNotFoundError:
        """The 404 for a name that is neither served nor an alias, suggesting the closest names that are."""
        retired = self.retired.get(name)
        if retired is not None:
            return retired.error()
        served = sorted(set(served))
        return unknown_model_error(name, [*served, *self.aliases], served)


def unknown_model_error(name: str, known: Iterable[str], listing: Iterable[str] = ()) -> ModelNotFoundError:
    """404 for `name`: the closest of `known` (served ids and aliases) as suggestions, then `listing` (what is
    served) in full when it is short."""
    known = sorted(set(known))
    close = difflib.get_close_matches(name, known, n=SUGGESTIONS, cutoff=SUGGESTION_CUTOFF)
    if not close:
        # Case and punctuation differ most often between a user's spelling and an id (`Llama-3.3` vs `llama3.3`).
        folded = {_fold(k): k for k in known}
        matches = difflib.get_close_matches(_fold(name), list(folded), SUGGESTIONS, SUGGESTION_CUTOFF)
        close = [folded[m] for m in matches]
    text = f"model {name!r} is not served in this mesh"
    if close:
        text += f" (did you mean {' or '.join(repr(c) for c in close)}?)"
    listing = sorted(set(listing))
    if not listing:
        text += "; none are being served"
    else:
        shown = ", ".join(listing[:LISTED])
        more = f" and {len(listing) - LISTED} more" if len(listing) > LISTED else ""
        text += f"; available models: {shown}{more}"
    return ModelNotFoundError(text, param="model", suggestions=close)


def _fold(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())
