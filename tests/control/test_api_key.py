"""``--api-key``: /v1 needs the key as a bearer token (401 in OpenAI's shape without it);
health, readiness and metrics stay open; the admin token stays separate; the key is never
logged (issue 11, "Security")."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from control.core.config import Settings
from tests.control.support import ADMIN, TOKEN, ServerProcess
from tests.control.test_hostile_inputs import assert_openai_error
from tests.control.test_request_observability import refused

API_KEY = "sk-test-5b1e0c9a77d24f0d"
KEYED = {"Authorization": f"Bearer {API_KEY}"}
BODY = {"prompt": "Hi", "max_tokens": 2}


@pytest.fixture(scope="module")
def keyed_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("keyed-server")
    key_file = workdir / "api-key"
    key_file.write_text(API_KEY + "\n")
    server = ServerProcess(
        tiny_model_dir, workdir, ["--admin-token", TOKEN, "--api-key-file", str(key_file)], {}
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(keyed_server: ServerProcess) -> Iterator[httpx.Client]:
    with keyed_server.client() as client:
        yield client


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer sk-wrong"}, ADMIN])
@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/completions"), ("GET", "/v1/models")])
def test_v1_without_the_key_is_401(http: httpx.Client, method: str, path: str, headers) -> None:
    before = refused(http, "unauthorized")
    response = http.request(method, path, json=BODY, headers=headers)
    error = assert_openai_error(response, 401, None)
    assert error["code"] == "invalid_api_key"
    assert response.headers["www-authenticate"] == "Bearer"
    assert refused(http, "unauthorized") == before + 1


def test_the_key_is_checked_before_the_body(http: httpx.Client) -> None:
    response = http.post("/v1/completions", json={"prompt": ""})
    assert_openai_error(response, 401, None)


def test_v1_with_the_key_is_served(http: httpx.Client) -> None:
    response = http.post("/v1/completions", json=BODY, headers=KEYED)
    assert response.status_code == 200, response.text
    assert http.get("/v1/models", headers=KEYED).status_code == 200


@pytest.mark.parametrize("path", ["/health", "/ready", "/metrics", "/openapi.json"])
def test_probes_and_metrics_stay_open(http: httpx.Client, path: str) -> None:
    assert http.get(path).status_code == 200


def test_the_admin_token_stays_separate(http: httpx.Client) -> None:
    assert http.get("/admin/state", headers=KEYED).status_code == 403
    assert http.get("/admin/state", headers=ADMIN).status_code == 200


def test_the_key_is_never_logged(http: httpx.Client, keyed_server: ServerProcess) -> None:
    http.post("/v1/completions", json=BODY, headers={"Authorization": "Bearer sk-wrong"})
    http.post("/v1/completions", json=BODY, headers=KEYED)
    assert API_KEY not in keyed_server.log()


def test_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVEDECK_API_KEY", API_KEY)
    key = Settings().api_key
    assert key is not None and key.get_secret_value() == API_KEY
    assert API_KEY not in repr(Settings())


def test_both_key_sources_or_an_empty_key_are_refused(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(API_KEY)
    with pytest.raises(ValidationError, match="not both"):
        Settings(api_key=API_KEY, api_key_file=key_file)
    with pytest.raises(ValidationError, match="must not be empty"):
        Settings(api_key=" ")
    key_file.write_text("\n")
    with pytest.raises(ValidationError, match="is empty"):
        Settings(api_key_file=key_file)


def test_serve_exits_2_on_a_missing_key_file(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-key"
    result = subprocess.run(
        [sys.executable, "-m", "control.cli", "serve", "--api-key-file", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "cannot read the API key file" in result.stderr
