"""The fleet's replicas across polls: which one went down, which one came back.

``/admin/state`` only says how each replica is *now*. A replica Ray Serve restarts comes back
as a new replica id (and a new pid); one that died may first answer with an error (``up``
false), then leave the list. ``ReplicaRoster`` keeps one row per slot so the operator sees the
story: a row that stops answering turns DOWN with its error and stays DOWN (even once it left
the list) until a new replica takes its slot, which is then marked restarted, with the pid it
replaced, for ``RESTART_MARK_S``. Only a replica that left the list gives up its slot: one
still listed may be alive but slow to answer (the fleet's state call times out every replica
while Ray has not yet noticed a dead one). The same replica id answering with another pid or
start time is a restart too. No Textual here: the rules are tested on plain data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tui.models import ReplicaView

RESTART_MARK_S = 30.0
"""How long a restarted replica keeps its "restarted" mark."""
GONE_KEEP_S = 120.0
"""How long a replica that left the list stays shown (DOWN) when nothing takes its slot."""
GONE_ERROR = "no longer in the fleet"


@dataclass(slots=True)
class ReplicaRow:
    """One slot of the panel: the replica holding it now and what happened to it."""

    view: ReplicaView
    last_pid: int | None = None
    last_started_at: float | None = None
    restarted_at: float | None = None
    """When (the console's clock) the slot's replica was seen restarted."""
    replaced_pid: int | None = None
    replaced: str | None = None
    """The replica id this one took the slot of (None when the same id restarted)."""
    gone_since: float | None = None
    retired: set[str] = field(default_factory=set)
    """Ids that held the slot before; a late answer from one of them is ignored."""

    @property
    def key(self) -> str:
        return self.view.replica

    @property
    def up(self) -> bool:
        return self.view.up and self.gone_since is None

    def restarted(self, now: float) -> bool:
        return self.restarted_at is not None and now - self.restarted_at < RESTART_MARK_S

    def _seen(self, view: ReplicaView, now: float) -> None:
        """The slot's replica answered again: same id, or a replacement (``_replace``)."""
        if view.up and self.last_pid is not None and view.pid is not None:
            moved = view.pid != self.last_pid or (
                view.started_at is not None
                and self.last_started_at is not None
                and view.started_at != self.last_started_at
            )
            if moved:
                self.restarted_at, self.replaced_pid = now, self.last_pid
        self.view, self.gone_since = view, None
        if view.up and view.pid is not None:
            self.last_pid, self.last_started_at = view.pid, view.started_at

    def _replace(self, view: ReplicaView, now: float) -> None:
        self.retired.add(self.view.replica)
        self.replaced, self.replaced_pid, self.restarted_at = self.view.replica, self.last_pid, now
        self.last_pid = self.last_started_at = None
        self._seen(view, now)

    def _gone(self, now: float) -> None:
        if self.gone_since is None:
            self.gone_since = now
            error = self.view.error if not self.view.up and self.view.error else GONE_ERROR
            self.view = self.view.model_copy(update={"up": False, "error": error})


class ReplicaRoster:
    def __init__(self) -> None:
        self.rows: list[ReplicaRow] = []

    def update(self, views: Sequence[ReplicaView], now: float) -> list[ReplicaRow]:
        """Fold one poll's replicas in; the rows to show, in a stable order."""
        first = not self.rows
        retired = set().union(*(row.retired for row in self.rows))
        fresh = {v.replica: v for v in views if v.replica not in retired}
        for row in self.rows:
            if row.key in fresh:
                row._seen(fresh.pop(row.key), now)
            else:
                row._gone(now)
        for view in fresh.values():
            slot = None if first else self._free_slot()
            if slot is None:
                self.rows.append(ReplicaRow(view=view))
                self.rows[-1]._seen(view, now)
            else:
                slot._replace(view, now)
        self.rows = [
            row for row in self.rows if row.gone_since is None or now - row.gone_since < GONE_KEEP_S
        ]
        return self.rows

    def _free_slot(self) -> ReplicaRow | None:
        """The slot a new replica takes: the one that left the list first."""
        gone = [row for row in self.rows if row.gone_since is not None]
        return min(gone, key=lambda row: row.gone_since or 0.0) if gone else None
