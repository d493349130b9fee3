"""Per-key rate buckets, and on PostgreSQL admission and completion as one statement each.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# Every writer locks a key's rows in one order, the key, its usage row, its budget counter, its rate bucket, so two
# transactions never wait for each other in a circle.
#
# Admission of one request in one round trip, its own transaction. Python passes the bucket arithmetic (second,
# slot, window start) and the key's limits from its cache; the decision is check() of frontend/limits.py (budgets,
# then rates; a limit is broken once what was used reaches it), which tests/frontend/test_pg_functions.py holds
# this to. On refusal nothing is written.
ADMIT = """
CREATE OR REPLACE FUNCTION otela_admit(
    p_key text, p_now double precision, p_second bigint, p_slot integer, p_since bigint,
    p_period text, p_start double precision,
    p_rpm bigint, p_tpm bigint, p_budget_requests bigint, p_budget_tokens bigint,
    p_id text, p_request_id text, p_instance text, p_endpoint text, p_model text, p_stream boolean,
    p_input_tokens integer, p_day text, p_sampling json,
    OUT admitted boolean, OUT minute_requests bigint, OUT minute_tokens bigint, OUT oldest_second bigint,
    OUT period_requests bigint, OUT period_tokens bigint)
LANGUAGE plpgsql AS $$
BEGIN
    -- The key's row lock serializes the admissions of one key, whichever replica makes them. NO KEY: usage rows
    -- and counters of the key, whose foreign keys take a KEY SHARE lock on it, are written meanwhile.
    PERFORM 1 FROM api_keys WHERE id = p_key FOR NO KEY UPDATE;
    SELECT coalesce(sum(requests), 0), coalesce(sum(tokens), 0), min(second)
        INTO minute_requests, minute_tokens, oldest_second
        FROM usage_rate WHERE key_id = p_key AND second >= p_since;
    period_requests := 0;
    period_tokens := 0;
    IF p_period IS NOT NULL THEN
        SELECT requests, tokens INTO period_requests, period_tokens
            FROM usage_counters WHERE key_id = p_key AND period = p_period AND start = p_start;
        period_requests := coalesce(period_requests, 0);
        period_tokens := coalesce(period_tokens, 0);
    END IF;
    admitted := otela_within_limits(minute_requests, minute_tokens, period_requests, period_tokens,
                                    p_rpm, p_tpm, p_budget_requests, p_budget_tokens);
    IF NOT admitted THEN
        RETURN;
    END IF;
    UPDATE api_keys SET last_used_at = p_now WHERE id = p_key;
    INSERT INTO usage (id, request_id, key_id, instance, endpoint, model, stream, status, input_tokens,
                       output_tokens, tokens_estimated, started_at, day, sampling)
        VALUES (p_id, p_request_id, p_key, p_instance, p_endpoint, p_model, p_stream, 'pending', p_input_tokens,
                0, true, p_now, p_day, p_sampling);
    IF p_period IS NOT NULL THEN
        INSERT INTO usage_counters (key_id, period, start, requests, tokens)
            VALUES (p_key, p_period, p_start, 1, p_input_tokens)
            ON CONFLICT (key_id, period, start) DO UPDATE SET
                requests = usage_counters.requests + 1, tokens = usage_counters.tokens + excluded.tokens;
    END IF;
    INSERT INTO usage_rate (key_id, slot, second, requests, tokens)
        VALUES (p_key, p_slot, p_second, 1, p_input_tokens)
        ON CONFLICT (key_id, slot) DO UPDATE SET
            requests = CASE WHEN excluded.second > usage_rate.second THEN 1
                            ELSE usage_rate.requests + 1 END,
            tokens = CASE WHEN excluded.second > usage_rate.second THEN excluded.tokens
                          ELSE usage_rate.tokens + excluded.tokens END,
            second = greatest(usage_rate.second, excluded.second);
END $$
"""

WITHIN_LIMITS = """
CREATE OR REPLACE FUNCTION otela_within_limits(
    minute_requests bigint, minute_tokens bigint, period_requests bigint, period_tokens bigint,
    rpm bigint, tpm bigint, budget_requests bigint, budget_tokens bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT NOT (coalesce(period_requests >= budget_requests, false)
                OR coalesce(period_tokens >= budget_tokens, false)
                OR coalesce(minute_requests >= rpm, false)
                OR coalesce(minute_tokens >= tpm, false))
$$
"""

# Completion of one request in one round trip: the final columns, and the token difference added to its budget
# counter and to its rate bucket (if the bucket still holds its second). False when the row is not there.
COMPLETE = """
CREATE OR REPLACE FUNCTION otela_complete(
    p_id text, p_status text, p_http_status integer, p_provider text, p_node text,
    p_input_tokens integer, p_output_tokens integer, p_tokens_estimated boolean,
    p_finished_at double precision, p_latency_ms double precision, p_ttft_ms double precision, p_error text,
    p_key text, p_period text, p_start double precision, p_second bigint, p_slot integer, p_delta bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE usage SET status = p_status, http_status = p_http_status, provider = p_provider, node = p_node,
                     input_tokens = p_input_tokens, output_tokens = p_output_tokens,
                     tokens_estimated = p_tokens_estimated, finished_at = p_finished_at,
                     latency_ms = p_latency_ms, ttft_ms = p_ttft_ms, error = p_error
        WHERE id = p_id;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_delta <> 0 THEN
        IF p_period IS NOT NULL THEN
            INSERT INTO usage_counters (key_id, period, start, requests, tokens)
                VALUES (p_key, p_period, p_start, 0, p_delta)
                ON CONFLICT (key_id, period, start) DO UPDATE SET tokens = usage_counters.tokens + excluded.tokens;
        END IF;
        UPDATE usage_rate SET tokens = tokens + p_delta
            WHERE key_id = p_key AND slot = p_slot AND second = p_second;
    END IF;
    RETURN true;
END $$
"""


def upgrade() -> None:
    """Create usage_rate, fill it from the rows of the last minute, and add the PostgreSQL functions."""
    op.create_table(
        "usage_rate",
        sa.Column("key_id", sa.String(32), sa.ForeignKey("api_keys.id"), primary_key=True),
        sa.Column("slot", sa.Integer, primary_key=True),
        sa.Column("second", sa.BigInteger, nullable=False),
        sa.Column("requests", sa.BigInteger, nullable=False),
        sa.Column("tokens", sa.BigInteger, nullable=False),
    )
    # Imported here: the migration environment must not import the package's modules at collection time.
    from opentela.frontend.counters import rebuild_rate_sync

    rebuild_rate_sync(op.get_bind(), time.time())
    if op.get_bind().dialect.name == "postgresql":
        for function in (WITHIN_LIMITS, ADMIT, COMPLETE):
            op.execute(function)


def downgrade() -> None:
    """Drop the functions and the rate buckets (the rows stay the source of truth)."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS otela_admit")
        op.execute("DROP FUNCTION IF EXISTS otela_complete")
        op.execute("DROP FUNCTION IF EXISTS otela_within_limits")
    op.drop_table("usage_rate")
