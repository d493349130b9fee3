"""What the trace needs beyond token counts: prefix hashes and reasoning per usage row, and the trace's salt.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add usage.prefix_hashes and usage.reasoning (null for older rows), an index by status and start time, and the
    frontend_settings table."""
    if op.get_bind().dialect.name == "postgresql":
        # Upgrading from 0001 in one go, 0002 streamed the usage rows through a server-side cursor, which
        # PostgreSQL keeps open to the end of the transaction; ALTER TABLE refuses to run while one is.
        op.execute("CLOSE ALL")
    op.add_column("usage", sa.Column("prefix_hashes", sa.LargeBinary, nullable=True))
    op.add_column("usage", sa.Column("reasoning", sa.Boolean, nullable=True))
    # The workload view reads the completed requests of one time window over every key.
    op.create_index("ix_usage_status_started", "usage", ["status", "started_at"])
    op.create_table(
        "frontend_settings",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )


def downgrade() -> None:
    """Drop what upgrade added."""
    op.drop_table("frontend_settings")
    op.drop_index("ix_usage_status_started", "usage")
    with op.batch_alter_table("usage") as batch:
        batch.drop_column("reasoning")
        batch.drop_column("prefix_hashes")
