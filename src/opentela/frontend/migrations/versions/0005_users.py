"""Users who log in with OpenID Connect, their sessions, per-group limits, and the owner of a self-service key.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create users, user_sessions and group_limits; add api_keys.owner_id (null: a key an administrator made)."""
    op.create_table(
        "users",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("issuer", sa.String(500), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("email", sa.String(320), nullable=True),
        sa.Column("name", sa.String(200), nullable=True),
        sa.Column("groups", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("last_login_at", sa.Float, nullable=False),
        sa.UniqueConstraint("issuer", "subject", name="uq_users_issuer_subject"),
    )
    op.create_table(
        "user_sessions",
        sa.Column("id_hash", sa.String(64), primary_key=True),
        sa.Column("user_id", sa.String(32), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float, nullable=True),
        sa.Column("id_token", sa.Text, nullable=True),
    )
    op.create_index("ix_user_sessions_user_id", "user_sessions", ["user_id"])
    op.create_table(
        "group_limits",
        sa.Column("group_name", sa.String(200), primary_key=True),
        sa.Column("max_keys", sa.Integer, nullable=False),
        sa.Column("budget_tokens", sa.BigInteger, nullable=True),
        sa.Column("budget_requests", sa.BigInteger, nullable=True),
        sa.Column("budget_period", sa.String(16), nullable=False),
        sa.Column("rpm_limit", sa.BigInteger, nullable=True),
        sa.Column("tpm_limit", sa.BigInteger, nullable=True),
        sa.Column("allowed_models", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    # A plain ADD COLUMN on both databases, so api_keys (which usage rows reference) is never copied and dropped.
    # SQLite accepts a REFERENCES clause on an added column whose default is null, but Alembic would emit the
    # foreign key as a separate ALTER, which SQLite lacks: there it goes in the column's own DDL.
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE api_keys ADD COLUMN owner_id VARCHAR(32) REFERENCES users (id)")
    else:
        op.add_column(
            "api_keys",
            sa.Column(
                "owner_id", sa.String(32), sa.ForeignKey("users.id", name="fk_api_keys_owner"), nullable=True
            ),
        )
    op.create_index("ix_api_keys_owner_id", "api_keys", ["owner_id"])


def downgrade() -> None:
    """Drop what upgrade added."""
    op.drop_index("ix_api_keys_owner_id", "api_keys")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("owner_id")
    op.drop_table("group_limits")
    op.drop_index("ix_user_sessions_user_id", "user_sessions")
    op.drop_table("user_sessions")
    op.drop_table("users")
