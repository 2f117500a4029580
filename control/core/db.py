"""The SQLite engine: WAL, a busy timeout and foreign keys on every connection.

A connection SQLite opened while the file was read-only stays read-only after the file is
writable again, so one that fails a write as read-only is dropped from the pool (the next
checkout opens a fresh one) instead of refusing every write it is handed.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import ExceptionContext

BUSY_TIMEOUT_MS = 5000
SQLITE_READONLY = 8
"""SQLite's primary result code of a write refused as read-only (its extended codes share it
in the low byte)."""


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def make_engine(path: Path) -> Engine:
    path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        sqlite_url(path),
        connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000},
    )
    event.listen(engine, "connect", _on_connect)
    event.listen(engine, "handle_error", _drop_read_only)
    return engine


def unavailable(exc: BaseException) -> str:
    """What a refused database operation answers: ``store unavailable: <SQLite's reason>``
    (``database or disk is full``, ``attempt to write a readonly database``, ...)."""
    cause = getattr(exc, "orig", None) or exc
    return f"store unavailable: {cause}"


# Any: SQLAlchemy's connect event hands the DBAPI connection (sqlite3's), untyped there
def _on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _drop_read_only(context: ExceptionContext) -> None:
    """Invalidate (only) the connection a write was refused on as read-only."""
    error = context.original_exception
    if isinstance(error, sqlite3.Error) and error.sqlite_errorcode & 0xFF == SQLITE_READONLY:
        context.is_disconnect = True
        context.invalidate_pool_on_disconnect = False
