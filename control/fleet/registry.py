"""The live ``FleetRouter`` of each deployment in this process (no Ray import).

Ray Serve ships a custom router class by value (cloudpickle), so a registry inside the
router's own module would be a copy per unpickling; this module is imported by reference."""

from __future__ import annotations

from typing import Any

ROUTERS: dict[str, Any] = {}
"""Deployment name -> its ``FleetRouter`` (the one the handle in this process uses)."""


def router_of(deployment: str) -> Any:
    return ROUTERS.get(deployment)
