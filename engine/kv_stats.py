"""What the KV block pool reports: its accounting (``KVStats``), a block's state and what a
reclaim sweep did. Defined once here; the control plane's ``/admin/state`` and metrics reuse
these types rather than restating them."""

from __future__ import annotations

import enum
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, computed_field
from pydantic.dataclasses import dataclass


class BlockState(enum.Enum):
    FREE = "free"
    USED = "used"
    CACHED = "cached"


class KVStats(BaseModel):
    """The pool's accounting at one moment: ``free + used + cached == total``."""

    model_config = ConfigDict(frozen=True, from_attributes=True)

    block_size: int = Field(description="Token slots per block.")
    total: int = Field(description="Blocks in the pool.")
    free: int = Field(description="Blocks on the free list.")
    used: int = Field(description="Blocks with a reference count above 0.")
    cached: int = Field(description="Unreferenced blocks holding a reusable prefix.")
    reserved: int = Field(description="Free-or-cached blocks admission must leave alone.")
    live_tokens: int = Field(description="Tokens whose K/V is stored in used blocks.")
    held_slots: int = Field(description="Slots of the used blocks (used × block_size).")

    @computed_field(  # type: ignore[prop-decorator]  # mypy refuses a decorator on @property; pydantic's documented form
        description="live_tokens / held_slots: padding and half-empty blocks lower it."
    )
    @property
    def utilization(self) -> float:
        return self.live_tokens / self.held_slots if self.held_slots else 0.0

    @computed_field(description="used / total.")  # type: ignore[prop-decorator]  # mypy refuses a decorator on @property; pydantic's documented form
    @property
    def usage(self) -> float:
        return self.used / self.total if self.total else 0.0


# The one declaration of a sweep's figures (its docstring is the API's description): the
# engine's snapshot (``ReclaimRecord``), a fleet replica's report, the fleet's sum (``total``)
# and the control plane's recorded run (``control.models.ReclaimRunBase``: its table and its
# API answer) carry these fields by these names.
@dataclass(frozen=True)
class ReclaimResult:
    """What one reclaim sweep did: blocks freed, cached blocks evicted by the reserve guard."""

    freed: int
    """Blocks put back on the free list: leaked tables and unreferenced blocks."""
    evicted: int
    """Cached prefix blocks evicted by the memory-reserve guard."""
    free_before: int
    """Free blocks before the sweep."""
    free_after: int
    """Free blocks after it."""
    reserve_breached: bool
    """Free and cached blocks together still fell under the reserve."""
    duration_s: float
    """How long the sweep took."""

    @classmethod
    def total(cls, runs: Iterable[ReclaimResult]) -> ReclaimResult:
        """One sweep over several pools (a fleet, one pool a replica): the blocks summed, the
        reserve breached if any pool's was, as long as the slowest sweep."""
        each = list(runs)
        return cls(
            freed=sum(r.freed for r in each),
            evicted=sum(r.evicted for r in each),
            free_before=sum(r.free_before for r in each),
            free_after=sum(r.free_after for r in each),
            reserve_breached=any(r.reserve_breached for r in each),
            duration_s=max((r.duration_s for r in each), default=0.0),
        )


class KVIntegrity(BaseModel):
    """The block manager's self-check, taken at a step boundary."""

    model_config = ConfigDict(frozen=True)
    ok: bool
    problems: tuple[str, ...] = Field(description="Each contradiction found; empty when ok.")
    stats: KVStats
