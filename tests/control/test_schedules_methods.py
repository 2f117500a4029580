"""A method ``/admin/schedules`` has no route for answers 405 naming every method the path has
(each method is a route of its own: routing alone would name only the first one's)."""

from __future__ import annotations

import httpx
import pytest

from tests.control.support import ADMIN


@pytest.mark.parametrize(
    ("path", "allow", "methods"),
    [
        ("/admin/schedules", "GET, POST", ["OPTIONS", "PUT", "PATCH", "DELETE", "TRACE"]),
        ("/admin/schedules/1", "GET, DELETE", ["OPTIONS", "PUT", "PATCH", "POST", "TRACE"]),
    ],
)
def test_other_methods_are_405_with_allow(
    client: httpx.Client, path: str, allow: str, methods: list[str]
) -> None:
    for headers in (ADMIN, {}):
        for method in methods:
            response = client.request(method, path, headers=headers)
            assert (response.status_code, response.headers.get("allow")) == (405, allow), method
    assert client.get(path, headers=ADMIN).status_code in (200, 404)
