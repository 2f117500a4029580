"""405 with ``Allow`` naming every method of a path.

Each method of a path is a route of its own, so a method none of them has gets the first
route's 405, whose ``Allow`` names only that route's method. ``answer_other_methods`` adds one
route for the other methods that answers 405 with the path's full ``Allow``, before auth, as
routing would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fastapi import APIRouter, Response

METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE")


def _not_allowed(allow: str) -> Callable[[], Response]:
    def method_not_allowed() -> Response:
        return Response(status_code=405, headers={"Allow": allow})

    return method_not_allowed


def answer_other_methods(router: APIRouter, path: str, allowed: Sequence[str]) -> None:
    router.add_api_route(
        path,
        _not_allowed(", ".join(allowed)),
        methods=[m for m in METHODS if m not in allowed],
        include_in_schema=False,
    )
