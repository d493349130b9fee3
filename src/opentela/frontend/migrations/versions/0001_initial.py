"""API keys and usage rows.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create api_keys and usage."""
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("prefix", sa.String(32), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("rotated_at", sa.Float, nullable=True),
        sa.Column("expires_at", sa.Float, nullable=True),
        sa.Column("revoked_at", sa.Float, nullable=True),
        sa.Column("last_used_at", sa.Float, nullable=True),
        sa.Column("budget_tokens", sa.BigInteger, nullable=True),
        sa.Column("budget_requests", sa.BigInteger, nullable=True),
        sa.Column("budget_period", sa.String(16), nullable=False),
        sa.Column("rpm_limit", sa.BigInteger, nullable=True),
        sa.Column("tpm_limit", sa.BigInteger, nullable=True),
        sa.Column("allowed_models", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("trusted_providers", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("log_content", sa.Boolean, nullable=False),
    )
    op.create_table(
        "usage",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("key_id", sa.String(32), sa.ForeignKey("api_keys.id"), nullable=False),
        sa.Column("instance", sa.String(200), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("model", sa.String(300), nullable=False),
        sa.Column("stream", sa.Boolean, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("http_status", sa.Integer, nullable=True),
        sa.Column("provider", sa.String(200), nullable=True),
        sa.Column("node", sa.String(200), nullable=True),
        sa.Column("input_tokens", sa.Integer, nullable=False),
        sa.Column("output_tokens", sa.Integer, nullable=False),
        sa.Column("tokens_estimated", sa.Boolean, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("day", sa.String(10), nullable=False),
        sa.Column("latency_ms", sa.Float, nullable=True),
        sa.Column("ttft_ms", sa.Float, nullable=True),
        sa.Column("sampling", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("error", sa.Text, nullable=True),
    )
    op.create_index("ix_usage_key_started", "usage", ["key_id", "started_at"])
    op.create_index("ix_usage_status_instance", "usage", ["status", "instance"])
    op.create_index("ix_usage_day", "usage", ["day"])


def downgrade() -> None:
    """Drop both tables."""
    op.drop_table("usage")
    op.drop_table("api_keys")
