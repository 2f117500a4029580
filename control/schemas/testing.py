"""The test-only routes' answers (``SERVEDECK_TESTING=1``)."""

from __future__ import annotations

from datetime import datetime

from pydantic import (
    BaseModel,
    Field,
)


class LeakResult(BaseModel):
    """Test-only: a request dropped without freeing its blocks."""

    request_id: str
    leaked: bool
    blocks: int = Field(description="Blocks the request held just before it was dropped.")
    at: datetime


class StallResult(BaseModel):
    """Test-only: the engine loop is blocked for ``seconds`` from ``at``."""

    seconds: float
    at: datetime


class StorePages(BaseModel):
    """Test-only: the SQLite file's pages, and the cap every new connection gets (None: off)."""

    page_size: int
    page_count: int
    freelist_count: int = Field(description="Free pages a write uses before growing the file.")
    max_page_count: int | None = Field(description="A write needing more pages is refused.")
