"""Alembic environment: migrations run on the connection the frontend hands over at start-up."""

from __future__ import annotations

from alembic import context

from opentela.frontend.schema import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("the frontend applies its migrations itself on start (Database.migrate)")
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
