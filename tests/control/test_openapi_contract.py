"""The public contract (issue 43: "nothing public changes"): ``/openapi.json`` as the shared
server serves it equals the committed ``docs/openapi.json``, so a refactor that changes a path,
a method, a body, a field, a code or a limit shows here, not in a client. The shared server's
flags (``tests/control/conftest.py`` ``MAIN_SERVER_ARGS``) set the limits the document states;
its test-only routes (``/admin/testing/*``, mounted under ``SERVEDECK_TESTING=1``) are left out.

A change meant to be public is committed with the document written again::

    SERVEDECK_UPDATE_OPENAPI=1 .venv/bin/python -m pytest tests/control/test_openapi_contract.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
UPDATE = "SERVEDECK_UPDATE_OPENAPI"
TEST_ONLY = "/admin/testing/"


def public(document: dict[str, Any]) -> dict[str, Any]:
    paths = {p: ops for p, ops in document["paths"].items() if not p.startswith(TEST_ONLY)}
    return {**document, "paths": paths}


def differing(mine: dict[str, Any], theirs: dict[str, Any], label: str) -> list[str]:
    return [
        f"{label}{name}"
        for name in sorted(mine.keys() | theirs.keys())
        if mine.get(name) != theirs.get(name)
    ]


def changed(served: dict[str, Any], committed: dict[str, Any]) -> list[str]:
    """Where the two differ: each top-level key, each path, each component by its kind."""
    nested = ("paths", "components")
    out = differing(
        {k: v for k, v in served.items() if k not in nested},
        {k: v for k, v in committed.items() if k not in nested},
        "",
    )
    out += differing(served.get("paths", {}), committed.get("paths", {}), "paths: ")
    mine, theirs = served.get("components", {}), committed.get("components", {})
    for kind in sorted(mine.keys() | theirs.keys()):
        out += differing(mine.get(kind, {}), theirs.get(kind, {}), f"components.{kind}: ")
    return out


def test_the_served_openapi_document_is_the_committed_one(client: httpx.Client) -> None:
    response = client.get("/openapi.json")
    assert response.status_code == 200, response.text
    served = public(response.json())
    if os.environ.get(UPDATE) == "1":
        COMMITTED.write_text(json.dumps(served, indent=1, sort_keys=True) + "\n")
    committed = json.loads(COMMITTED.read_text())
    assert served == committed, (
        f"/openapi.json differs from {COMMITTED.name} at {changed(served, committed)}; if the "
        f"change is meant to be public, write it again with {UPDATE}=1 and say so"
    )
