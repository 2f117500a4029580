"""``GET|PUT /admin/demo-load``: the demo load a server started with ``--demo-load`` sends
itself; the console pauses (rate 0) and resumes it."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from control.api.allow import answer_other_methods
from control.api.deps import AdminDep, ContextDep
from control.schemas.demo_load import DemoLoadUpdate, DemoLoadView
from control.schemas.errors import ADMIN_ERRORS, BAD_BODY, AdminError

admin = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep], responses=ADMIN_ERRORS)

NOT_STARTED = "the server was started without --demo-load (or the model is still loading)"


@admin.get("/demo-load", response_model=DemoLoadView)
def get_demo_load(ctx: ContextDep) -> DemoLoadView:
    if ctx.demo_load is None:
        return DemoLoadView(enabled=False)
    return ctx.demo_load.view()


@admin.put(
    "/demo-load",
    response_model=DemoLoadView,
    responses=BAD_BODY | {409: {"model": AdminError, "description": NOT_STARTED}},
)
def put_demo_load(body: DemoLoadUpdate, ctx: ContextDep) -> DemoLoadView:
    if ctx.demo_load is None:
        raise HTTPException(409, NOT_STARTED)
    ctx.demo_load.set_rate(body.rate)
    return ctx.demo_load.view().model_copy(update={"rate": body.rate})


router = APIRouter()
router.include_router(admin)
answer_other_methods(router, "/admin/demo-load", ["GET", "PUT"])
