"""The live ``FleetRouter`` of each deployment in this process (no Ray import).

Ray Serve ships a custom router class by value (cloudpickle), so a registry inside the
router's own module would be a copy per unpickling; this module is imported by reference."""

from __future__ import annotations

from typing import Protocol

from control.fleet.score import ReplicaLoad


class LiveRouter(Protocol):
    """What the control plane reads of a ``FleetRouter`` (control/fleet/router.py, which
    imports this module: the registry names no class of its)."""

    def replica_ids(self) -> list[str]: ...

    def loads(self) -> dict[str, ReplicaLoad | None]: ...

    def in_flight(self) -> dict[str, int]: ...


ROUTERS: dict[str, LiveRouter] = {}
"""Deployment name -> its ``FleetRouter`` (the one the handle in this process uses)."""


def router_of(deployment: str) -> LiveRouter | None:
    return ROUTERS.get(deployment)
