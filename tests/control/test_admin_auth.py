"""Every admin route wants the bearer token: 401 without, 403 when wrong, never logged."""

from __future__ import annotations

import httpx
import pytest

from tests.control.support import ADMIN, TOKEN, ServerProcess

ADMIN_ROUTES = [
    ("GET", "/admin/policy"),
    ("GET", "/admin/policy/schema"),
    ("GET", "/admin/policy/history"),
    ("PUT", "/admin/policy"),
    ("POST", "/admin/policy/rollback/1"),
    ("GET", "/admin/state"),
    ("POST", "/admin/reclaim"),
    ("GET", "/admin/jobs"),
    ("POST", "/admin/testing/leak/some-request"),
    ("POST", "/admin/testing/stall?seconds=1"),
]
WRONG_TOKEN = "wrong-token-91b2e7"


@pytest.mark.parametrize(("method", "path"), ADMIN_ROUTES)
def test_admin_route_without_token_is_401(client: httpx.Client, method: str, path: str) -> None:
    response = client.request(method, path, json={"reason": "x"})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer" in response.json()["detail"]


@pytest.mark.parametrize(("method", "path"), ADMIN_ROUTES)
def test_admin_route_with_wrong_token_is_403(client: httpx.Client, method: str, path: str) -> None:
    headers = {"Authorization": f"Bearer {WRONG_TOKEN}"}
    response = client.request(method, path, json={"reason": "x"}, headers=headers)
    assert response.status_code == 403
    assert "token is not valid" in response.json()["detail"]


def test_basic_auth_is_not_a_bearer_token(client: httpx.Client) -> None:
    response = client.get("/admin/policy", headers={"Authorization": f"Basic {TOKEN}"})
    assert response.status_code == 401


def test_right_token_is_accepted(client: httpx.Client) -> None:
    assert client.get("/admin/policy", headers=ADMIN).status_code == 200


def test_tokens_never_reach_the_log(client: httpx.Client, main_server: ServerProcess) -> None:
    client.get("/admin/state", headers={"Authorization": f"Bearer {WRONG_TOKEN}"})
    client.get("/admin/state", headers=ADMIN)
    log = main_server.log()
    assert "GET /admin/state" in log  # the access log is there, the tokens are not
    assert TOKEN not in log
    assert WRONG_TOKEN not in log
