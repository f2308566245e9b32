"""Alembic's environment for the store: run by `store.db.migrate` with the open connection, never from a CLI
of its own (the server migrates at start)."""

from alembic import context

from hunyuan_mt.store.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
