"""The frontend's hot path on PostgreSQL: admission and completion as one call each to the functions that migration
0003 installs (frontend/migrations/versions/0003_rate_buckets.py).

Done as separate statements, an admission took six round trips (begin, lock the key, read the window and counter,
insert the row, add to the counter, commit) and a completion five, each paying the network and the driver: about
3 ms of database time per request on loopback. One statement in its own implicit transaction is one round trip;
the logic stays the one of frontend/usage.py and frontend/group_commit.py, and the SQLite path runs the same steps as
Python statements (tests run both, and hold the functions' limit check to `limits.check`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

ADMIT_CALL = text(
    "SELECT admitted, minute_requests, minute_tokens, oldest_second, period_requests, period_tokens"
    " FROM otela_admit(:p_key, :p_now, :p_second, :p_slot, :p_since, :p_period, :p_start,"
    " :p_rpm, :p_tpm, :p_budget_requests, :p_budget_tokens,"
    " :p_id, :p_request_id, :p_instance, :p_endpoint, :p_model, :p_stream, :p_input_tokens, :p_day,"
    " CAST(:p_sampling AS json))"
)
"""Admit one request: (admitted, minute requests, minute tokens, oldest bucket, period requests, period tokens)."""

COMPLETE_CALL = text(
    "SELECT otela_complete(:p_id, :p_status, :p_http_status, :p_provider, :p_node, :p_input_tokens,"
    " :p_output_tokens, :p_tokens_estimated, :p_finished_at, :p_latency_ms, :p_ttft_ms, :p_error,"
    " :p_key, :p_period, :p_start, :p_second, :p_slot, :p_delta)"
)
"""Complete one request's row and add its token difference to its counters; whether the row was there."""

WITHIN_LIMITS_CALL = text(
    "SELECT otela_within_limits(:minute_requests, :minute_tokens, :period_requests, :period_tokens,"
    " :rpm, :tpm, :budget_requests, :budget_tokens)"
)
"""The functions' limit check alone (for tests holding it to `limits.check`)."""


def prefixed(values: dict[str, Any]) -> dict[str, Any]:
    """Bound parameters named as the functions name them."""
    return {"p_" + k: v for k, v in values.items()}
