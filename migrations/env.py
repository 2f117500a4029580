"""Alembic environment: targets ``SQLModel.metadata``; batch mode because SQLite cannot ALTER
most things in place."""

from __future__ import annotations

from pathlib import Path

from alembic import context
from sqlalchemy import Connection, make_url
from sqlmodel import SQLModel

import control.models  # noqa: F401  (registers the tables on SQLModel.metadata)
from control.core.db import make_engine

config = context.config
target_metadata = SQLModel.metadata


def _configure(
    *, url: str | None = None, connection: Connection | None = None, literal_binds: bool = False
) -> None:
    context.configure(
        connection=connection,
        url=url,
        literal_binds=literal_binds,
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
    )


def run_offline() -> None:
    _configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def _run_with(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_with(connection)
        return
    url = make_url(config.get_main_option("sqlalchemy.url") or "")
    if url.get_backend_name() != "sqlite" or not url.database:
        raise ValueError(f"servedeck keeps its state in an SQLite file; got {url!r}")
    engine = make_engine(Path(url.database))
    try:
        with engine.connect() as connection:
            _run_with(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
