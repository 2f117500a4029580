"""Test-only routes, mounted only when the server starts with ``SERVEDECK_TESTING=1``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import Engine, event

from control.api.deps import AdminDep, ContextDep, ServiceDep, TestingDep
from control.models import utcnow
from control.schemas.errors import ADMIN_ERRORS
from control.schemas.testing import LeakResult, StallResult, StorePages

router = APIRouter(
    prefix="/admin/testing", tags=["testing"], dependencies=[AdminDep], responses=ADMIN_ERRORS
)


@router.post("/leak/{request_id}", response_model=LeakResult)
def leak(request_id: str, service: ServiceDep, hooks: TestingDep) -> LeakResult:
    """Drop a request without freeing its KV blocks: what the reclaim sweep must repair."""
    rows = service.snapshot().requests
    blocks = next((row.blocks for row in rows if row.id == request_id), 0)
    leaked = hooks.leak(request_id)
    return LeakResult(request_id=request_id, leaked=leaked, blocks=blocks, at=utcnow())


@router.post("/stall", response_model=StallResult)
def stall_engine(hooks: TestingDep, seconds: Annotated[float, Query(gt=0, le=600)]) -> StallResult:
    """Block the engine loop for ``seconds`` in its next step with requests in flight (what
    the stall watchdog must notice); answers at once."""
    hooks.stall(seconds)
    return StallResult(seconds=seconds, at=utcnow())


@dataclass(eq=False)
class _PageCap:
    """The ``connect`` listener that gives each new connection ``PRAGMA max_page_count``."""

    pages: int | None = None

    # Any: SQLAlchemy's connect event hands the DBAPI connection, untyped there
    def __call__(self, dbapi_connection: Any, _record: Any) -> None:
        if self.pages is not None:
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute(f"PRAGMA max_page_count={self.pages}")
            finally:
                cursor.close()


_cap = _PageCap()


@router.post("/store-full", response_model=StorePages)
def fill_store(ctx: ContextDep) -> StorePages:
    """Make the database file full for real: every connection from now on may not grow it past
    its current page count (SQLite's ``max_page_count``), so a write that needs a new page is
    refused with ``database or disk is full``, as on a full disk. Free pages are used first."""
    _cap.pages = _pages(ctx.db).page_count
    _reconnect(ctx.db)
    return _pages(ctx.db)


@router.delete("/store-full", response_model=StorePages)
def free_store(ctx: ContextDep) -> StorePages:
    """Lift the cap (new connections grow the file again)."""
    _cap.pages = None
    _reconnect(ctx.db)
    return _pages(ctx.db)


def _reconnect(db: Engine) -> None:
    """Pooled connections are closed, so every connection from now on is a new one."""
    if not event.contains(db, "connect", _cap):
        event.listen(db, "connect", _cap)
    db.dispose()


def _pages(db: Engine) -> StorePages:
    with db.connect() as connection:

        def pragma(name: str) -> int:
            return int(connection.exec_driver_sql(f"PRAGMA {name}").scalar_one())

        return StorePages(
            page_size=pragma("page_size"),
            page_count=pragma("page_count"),
            freelist_count=pragma("freelist_count"),
            max_page_count=_cap.pages,
        )
