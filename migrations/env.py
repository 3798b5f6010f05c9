"""Alembic environment: online against a DSN, offline (``--sql``) for any dialect."""

from __future__ import annotations

import psycopg
from alembic import context
from sqlalchemy import create_engine, pool

from pgjournal.admin.migrate import VERSION_TABLE, migration_dialect
from pgjournal.store.catalog import lock_timeout
from pgjournal.store.schema import metadata

config = context.config


def _dsn() -> str:
    from pgjournal.server.dsn import resolve_dsn

    return config.attributes.get("dsn") or context.get_x_argument(as_dictionary=True).get("dsn") or resolve_dsn()


def run_offline() -> None:
    context.configure(
        url="postgresql+psycopg://",
        target_metadata=metadata,
        literal_binds=True,
        version_table=VERSION_TABLE,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations(dialect=migration_dialect())


def run_online() -> None:
    from pgjournal.server.connections import connection_kwargs
    from pgjournal.settings import Settings

    dsn = _dsn()
    limits = connection_kwargs(Settings.load())  # no statement timeout: DDL may build indexes
    lock_wait = config.attributes.get("lock_wait")  # ...but waits only so long for a lock (admin.migrate)

    def connect() -> psycopg.Connection:
        conn = psycopg.connect(dsn, autocommit=True, **limits)
        if lock_wait is not None:
            conn.execute(*lock_timeout(lock_wait, local=False))
        conn.autocommit = False
        return conn

    engine = create_engine("postgresql+psycopg://", creator=connect, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=metadata, version_table=VERSION_TABLE)
        with context.begin_transaction():
            context.run_migrations(dialect=migration_dialect())


if context.is_offline_mode():
    run_offline()
else:
    run_online()
