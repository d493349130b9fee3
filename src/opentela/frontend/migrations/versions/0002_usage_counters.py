"""Per-key budget counters, built from the usage rows already there.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create usage_counters and fill it from every usage row of keys with a budget."""
    op.create_table(
        "usage_counters",
        sa.Column("key_id", sa.String(32), sa.ForeignKey("api_keys.id"), primary_key=True),
        sa.Column("period", sa.String(16), primary_key=True),
        sa.Column("start", sa.Float, primary_key=True),
        sa.Column("requests", sa.BigInteger, nullable=False),
        sa.Column("tokens", sa.BigInteger, nullable=False),
    )
    # Imported here: the migration environment must not import the package's modules at collection time.
    from opentela.frontend.counters import rebuild_counters_sync

    rebuild_counters_sync(op.get_bind())


def downgrade() -> None:
    """Drop the counters (the rows stay the source of truth)."""
    op.drop_table("usage_counters")
