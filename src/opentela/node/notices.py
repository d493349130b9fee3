"""Notices: conditions a node cannot fix alone and its operator cannot see, each said once and shown on request.

A notice has a code (`bootstrap_self`, `bootstrap_unanswered`, `joined_nobody`, `no_peers`), the thing it is
about (an address, or "" for the node itself), a message that says what to do, and the wall-clock time it
appeared. Posting one that is already up changes nothing, so a condition seen on every retry is logged once at
WARNING; resolving it logs once at INFO. `/v1/health` and `/v1/dnt/stats` list the notices up now, and
`otela status` prints them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

BOOTSTRAP_SELF = "bootstrap_self"
BOOTSTRAP_UNANSWERED = "bootstrap_unanswered"
JOINED_NOBODY = "joined_nobody"
NO_PEERS = "no_peers"


@dataclass(frozen=True)
class Notice:
    """One condition the operator should act on."""

    code: str
    subject: str
    message: str
    since: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, as the node's health and stats carry it."""
        return {"code": self.code, "subject": self.subject, "message": self.message, "since": self.since}


class Notices:
    """The notices a node has up now, keyed by (code, subject)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._up: dict[tuple[str, str], Notice] = {}

    def __repr__(self) -> str:
        return f"<Notices {sorted(code for code, _ in self._up)}>"

    def __len__(self) -> int:
        return len(self._up)

    def post(self, code: str, message: str, subject: str = "") -> bool:
        """Put a notice up (logged at WARNING); True if it was not up already.

        A notice already up keeps its time and first message: the retries that see it again say nothing new.
        """
        key = (code, subject)
        if key in self._up:
            return False
        self._up[key] = Notice(code, subject, message, self._clock())
        logger.warning(message, extra={"notice": code})
        return True

    def resolve(self, code: str, subject: str = "", why: str = "") -> bool:
        """Take a notice down (logged at INFO); True if it was up."""
        notice = self._up.pop((code, subject), None)
        if notice is None:
            return False
        what = f"{code} ({subject})" if subject else code
        logger.info("resolved: %s%s", what, f": {why}" if why else "", extra={"notice": code})
        return True

    def resolve_code(self, code: str, why: str = "") -> None:
        """Take down every notice of `code`, whatever it is about."""
        for c, subject in [k for k in self._up if k[0] == code]:
            self.resolve(c, subject, why)

    def is_up(self, code: str, subject: str = "") -> bool:
        """Whether that notice is up now."""
        return (code, subject) in self._up

    def active(self) -> list[Notice]:
        """The notices up now, oldest first."""
        return sorted(self._up.values(), key=lambda n: n.since)

    def snapshot(self) -> list[dict[str, Any]]:
        """The notices up now, JSON-ready."""
        return [n.as_dict() for n in self.active()]
