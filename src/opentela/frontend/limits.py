"""Rate limits and budgets as pure arithmetic: windows, reset times, which limit a request would break, and which
group's limits a self-service user gets."""

from __future__ import annotations

import calendar
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from opentela.errors import OpenTelaError
from opentela.frontend.errors import BudgetExceededError, RateLimitExceededError

BUDGET_PERIODS = ("day", "week", "month", "total")
RATE_WINDOW_S = 60.0


def period_start(period: str, now: float) -> float:
    """Start of the budget period holding `now` (UTC calendar periods; `total` never resets)."""
    t = time.gmtime(now)
    if period == "day":
        return float(calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0)))
    if period == "week":
        return period_start("day", now) - t.tm_wday * 86400.0
    if period == "month":
        return float(calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0)))
    if period == "total":
        return 0.0
    raise ValueError(f"unknown budget period {period!r}")


def period_end(period: str, now: float) -> float | None:
    """When the budget period holding `now` ends (None for `total`)."""
    if period == "day":
        return period_start("day", now) + 86400.0
    if period == "week":
        return period_start("week", now) + 7 * 86400.0
    if period == "month":
        t = time.gmtime(now)
        year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
        return float(calendar.timegm((year, month, 1, 0, 0, 0)))
    if period == "total":
        return None
    raise ValueError(f"unknown budget period {period!r}")


@dataclass(frozen=True)
class Limits:
    """The limits of one key (None: unlimited)."""

    rpm: int | None = None
    tpm: int | None = None
    budget_tokens: int | None = None
    budget_requests: int | None = None
    budget_period: str = "month"


@dataclass(frozen=True)
class Consumption:
    """What a key used: in the last rate window (and when its oldest request leaves it) and in the period."""

    minute_requests: int = 0
    minute_tokens: int = 0
    oldest_in_minute: float | None = None
    period_requests: int = 0
    period_tokens: int = 0


@dataclass(frozen=True)
class Refusal:
    """Which limit a request breaks and when it frees up."""

    kind: str  # "rate" or "budget"
    limit: str  # requests_per_minute, tokens_per_minute, budget_requests, budget_tokens
    message: str
    resets_at: float | None

    def retry_after(self, now: float) -> float | None:
        """Seconds until the limit frees up (None: never, e.g. a `total` budget)."""
        return None if self.resets_at is None else max(0.0, self.resets_at - now)


def check(limits: Limits, used: Consumption, now: float) -> Refusal | None:
    """The first limit a new request would break, budgets before rates (a budget does not free up by waiting)."""
    end = period_end(limits.budget_period, now)
    per = "in total" if end is None else f"this {limits.budget_period}"
    if limits.budget_requests is not None and used.period_requests >= limits.budget_requests:
        return Refusal(
            "budget",
            "budget_requests",
            f"request budget spent: {used.period_requests} of {limits.budget_requests} requests {per}",
            end,
        )
    if limits.budget_tokens is not None and used.period_tokens >= limits.budget_tokens:
        return Refusal(
            "budget",
            "budget_tokens",
            f"token budget spent: {used.period_tokens} of {limits.budget_tokens} tokens {per}",
            end,
        )
    window_frees = (used.oldest_in_minute or now) + RATE_WINDOW_S
    if limits.rpm is not None and used.minute_requests >= limits.rpm:
        return Refusal(
            "rate",
            "requests_per_minute",
            f"rate limit: {used.minute_requests} of {limits.rpm} requests per minute",
            window_frees,
        )
    if limits.tpm is not None and used.minute_tokens >= limits.tpm:
        return Refusal(
            "rate",
            "tokens_per_minute",
            f"rate limit: {used.minute_tokens} of {limits.tpm} tokens per minute",
            window_frees,
        )
    return None


def refusal_error(refusal: Refusal, now: float) -> OpenTelaError:
    """The OpenAI-style error of a refusal: 429 for rates, 402 for budgets, with the reset time."""
    cls = BudgetExceededError if refusal.kind == "budget" else RateLimitExceededError
    details: dict[str, Any] = {"limit": refusal.limit}
    if refusal.resets_at is None:
        message = f"{refusal.message}; this budget never resets, ask an administrator to raise it"
    else:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(refusal.resets_at))
        message = f"{refusal.message}; resets at {when}"
        details["resets_at"] = refusal.resets_at
        if refusal.kind == "rate":
            details["retry_after"] = refusal.retry_after(now)
    return cls(message, **details)


DEFAULT_GROUP = "*"
"""The group limits of users none of whose groups has limits of its own."""


@dataclass(frozen=True)
class GroupLimits:
    """What the members of one group may do for themselves: how many active keys they may hold at once, and the
    limits every key they create gets (the key settings above; None: unlimited)."""

    max_keys: int = 3
    budget_tokens: int | None = None
    budget_requests: int | None = None
    budget_period: str = "month"
    rpm_limit: int | None = None
    tpm_limit: int | None = None
    allowed_models: tuple[str, ...] | None = None


BUILTIN_GROUP_LIMITS = GroupLimits()
"""What applies when neither a user's groups nor `*` has limits: three keys, each without limits."""


def pick_group(groups: Iterable[str], table: Mapping[str, GroupLimits]) -> tuple[str | None, GroupLimits]:
    """The group whose limits a user gets, and those limits.

    Of the user's groups that have limits, the one allowing the most keys (ties: the first name in sorting order):
    one group's limits as a whole, since budgets of different periods cannot be merged field by field. Else the
    `*` group's, else the built-in ones (group None).
    """
    mine = sorted({g for g in groups if g in table and g != DEFAULT_GROUP})
    if mine:
        most = max(table[g].max_keys for g in mine)
        best = next(g for g in mine if table[g].max_keys == most)
        return best, table[best]
    if DEFAULT_GROUP in table:
        return DEFAULT_GROUP, table[DEFAULT_GROUP]
    return None, BUILTIN_GROUP_LIMITS
