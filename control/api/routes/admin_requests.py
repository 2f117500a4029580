"""``GET /admin/requests/{seq_id}``: one request's prompt and output text, kept in memory by a
server started with ``--expose-text`` (control/requests_text.py), for the console's detail view."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from control.api.allow import answer_other_methods
from control.api.deps import NO_TEXT, AdminDep, TextDep
from control.requests_text import FINISHED_KEPT
from control.schemas.errors import ADMIN_ERRORS, AdminError
from control.schemas.requests import RequestText

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


router = APIRouter()
router.include_router(admin)
answer_other_methods(router, "/admin/requests/{seq_id}", ["GET"])
