"""``GET /admin/requests/{seq_id}``: one request's prompt and output text, kept in memory by a
server started with ``--expose-text`` (control/requests_text.py), for the console's detail view.
``GET /admin/requests/{seq_id}/timeline``: its timeline and why it waited (engine/timeline.py;
no text, so no ``--expose-text``)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from control.api.allow import answer_other_methods
from control.api.deps import NO_TEXT, AdminDep, ServiceDep, TextDep
from control.requests_text import FINISHED_KEPT
from control.schemas.errors import ADMIN_ERRORS, AdminError
from control.schemas.requests import RequestText
from engine.timeline import DEFAULT_TIMELINES_KEPT, RequestTimeline

admin = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep], responses=ADMIN_ERRORS)

UNKNOWN = (
    f"No such request: not running, nor one of the last {FINISHED_KEPT} finished "
    "(an older one's text is dropped)."
)


@admin.get(
    "/requests/{seq_id}",
    response_model=RequestText,
    responses={
        404: {"model": AdminError, "description": UNKNOWN},
        409: {"model": AdminError, "description": NO_TEXT},
    },
)
def get_request_text(seq_id: str, text: TextDep) -> RequestText:
    """The request's prompt and its output so far (``seq_id`` as in ``/admin/state``'s
    requests; a fork's ``#`` is sent as ``%23``)."""
    found = text.get(seq_id)
    if found is None:
        raise HTTPException(
            404,
            f"no request {seq_id!r}: not running, nor one of the last {FINISHED_KEPT} "
            "finished whose text is kept",
        )
    return found


TIMELINE_GONE = (
    "not running or waiting, nor one of the last finished whose timelines are kept "
    f"(--timelines-kept, default {DEFAULT_TIMELINES_KEPT}; an older one's is dropped)"
)
NO_TIMELINE = f"No such request: {TIMELINE_GONE}."


@admin.get(
    "/requests/{seq_id}/timeline",
    response_model=RequestTimeline,
    responses={404: {"model": AdminError, "description": NO_TIMELINE}},
)
def get_request_timeline(seq_id: str, service: ServiceDep) -> RequestTimeline:
    """The request's timeline: contiguous segments from its arrival to its end (waiting with
    its reason and figures, prefill with its chunks, decode) and the events between them, with
    its forks' for ``n`` > 1 (``seq_id`` as the API returned it, ``cmpl-…``/``chatcmpl-…``; a
    fork's ``#`` is sent as ``%23``). Holds no text: no ``--expose-text`` needed."""
    found = service.timeline(seq_id)
    if found is None:
        raise HTTPException(404, f"no request {seq_id!r}: {TIMELINE_GONE}")
    return found


router = APIRouter()
router.include_router(admin)
answer_other_methods(router, "/admin/requests/{seq_id}", ["GET"])
answer_other_methods(router, "/admin/requests/{seq_id}/timeline", ["GET"])
