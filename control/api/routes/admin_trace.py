"""``GET /admin/trace.csv``: the recent arrivals as the simulator's trace (times and lengths)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from fastapi import APIRouter, Response

from control.api.deps import AdminDep, RuntimeDep
from control.schemas.errors import ADMIN_ERRORS, Responses
from sim.trace import TraceRequest, write_trace

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep], responses=ADMIN_ERRORS)

TRACE_CSV: Responses = {
    200: {
        "content": {"text/csv": {"schema": {"type": "string"}}},
        "description": "One row per recent finished request, oldest first: "
        "arrived_at (seconds after the first row), num_prefill_tokens, num_decode_tokens "
        "(sim.trace's CSV; `servedeck simulate --trace` reads it). No text, no token ids.",
    }
}


def trace_csv(requests: list[TraceRequest]) -> str:
    """The trace as ``sim.trace.write_trace`` writes it (one owner of the format)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.csv"
        write_trace(path, requests)
        return path.read_text()


@router.get("/trace.csv", response_class=Response, responses=TRACE_CSV)
def get_trace(runtime: RuntimeDep) -> Response:
    return Response(
        trace_csv(runtime.arrivals.trace()),
        media_type="text/csv",
        headers={"Content-Disposition": 'attachment; filename="trace.csv"'},
    )
