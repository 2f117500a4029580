"""All routes of the server, one router per resource."""

from fastapi import APIRouter

from control.api.routes import (
    admin_demo_load,
    admin_guardrail,
    admin_maintenance,
    admin_policy,
    admin_requests,
    admin_schedules,
    admin_state,
    admin_trace,
    chat,
    completions,
    fleet,
    health,
    metrics,
    models,
)

api_router = APIRouter()
for module in (
    completions,
    chat,
    models,
    health,
    metrics,
    admin_policy,
    admin_state,
    admin_requests,
    admin_trace,
    admin_maintenance,
    admin_schedules,
    admin_guardrail,
    admin_demo_load,
    fleet,
):
    api_router.include_router(module.router)
