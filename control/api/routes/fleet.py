"""``POST /admin/fleet/restart``: a rolling restart of the engine replicas (``--replicas``),
one at a time; its progress is ``/admin/state``'s ``restart``."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from control.api.allow import answer_other_methods
from control.api.deps import NO_REPLICAS, AdminDep, ReplicasDep
from control.fleet.schemas import RestartView
from control.schemas.errors import ADMIN_ERRORS, AdminError

admin = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep], responses=ADMIN_ERRORS)

REFUSED = f"{NO_REPLICAS}; or a restart is running, or no replica is up"


@admin.post(
    "/fleet/restart",
    status_code=202,
    response_model=RestartView,
    responses={409: {"model": AdminError, "description": REFUSED}},
)
def restart_fleet(replicas: ReplicasDep) -> RestartView:
    """Restart every replica, one at a time: it leaves routing, its requests finish (for up to
    ``fleet_drain_timeout_s``), a new one starts on the policy version in force, and the next
    goes once that one is up. Answers at once with the replicas it restarts."""
    from control.fleet.restart import RestartRefused

    try:
        return replicas.restart()
    except RestartRefused as exc:
        raise HTTPException(409, str(exc)) from None


router = APIRouter()
router.include_router(admin)
answer_other_methods(router, "/admin/fleet/restart", ["POST"])
