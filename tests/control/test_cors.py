"""CORS is off unless configured: a browser on another origin gets no allow header by default,
and exactly the configured origins are allowed when set (``--cors-allow-origins``)."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from control.core.config import Settings
from control.server import create_app

PREFLIGHT = {
    "Origin": "https://console.example",
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization,content-type",
}


def app_with(tmp_path: Path, **settings) -> TestClient:
    # No ``with``: the lifespan (model load) does not run; CORS answers before any route.
    return TestClient(create_app(Settings(db=tmp_path / "db.sqlite", **settings), "t" * 20))


def test_cors_is_off_by_default(tmp_path: Path) -> None:
    response = app_with(tmp_path).options("/v1/completions", headers=PREFLIGHT)
    assert "access-control-allow-origin" not in response.headers


def test_configured_origins_and_only_those_are_allowed(tmp_path: Path) -> None:
    client = app_with(tmp_path, cors_allow_origins="https://console.example, https://b.example")
    allowed = client.options("/v1/completions", headers=PREFLIGHT)
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://console.example"
    other = client.options(
        "/v1/completions", headers={**PREFLIGHT, "Origin": "https://evil.example"}
    )
    assert "access-control-allow-origin" not in other.headers
