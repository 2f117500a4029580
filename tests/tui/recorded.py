"""Recorded server responses (tests/tui/fixtures, written to docs/api.md) served through
httpx.MockTransport, so the console's real HttpClient runs against them."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tui.client import HttpClient

FIXTURES = Path(__file__).parent / "fixtures"
URL = "http://servedeck.test:8000"
TOKEN = "T"

Handler = Callable[[httpx.Request], httpx.Response]


def load(name: str) -> Any:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def reply(name: str, status: int = 200, headers: dict[str, str] | None = None) -> Handler:
    body = load(name)
    return lambda request: httpx.Response(status, json=body, headers=headers)


def state_series(count: int) -> list[dict[str, Any]]:
    """``count`` states differing only in throughput, queue and KV usage (fixed numbers)."""
    base = load("state")
    tokens = [12.0, 30.5, 44.9, 38.0, 52.3, 41.2]
    queue = [(2, 3), (5, 5), (9, 5), (8, 5), (6, 5), (7, 5)]
    usage = [0.08, 0.15, 0.31, 0.27, 0.25, base["kv"]["usage"]]
    states = []
    for i in range(count):
        j = len(tokens) - count + i
        state = copy.deepcopy(base)
        state["throughput"]["output_tokens_per_s"] = tokens[j]
        state["queue"] |= {"waiting": queue[j][0], "running": queue[j][1]}
        state["kv"]["usage"] = usage[j]
        states.append(state)
    return states


class FakeClock:
    """The console's clock in tests: it moves only when a test sets ``now``."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RecordedServer:
    """Answers from recorded JSON; remembers every request. ``states`` are served in order
    and the last one repeats. Set ``down`` to refuse connections."""

    def __init__(self, states: list[dict[str, Any]] | None = None) -> None:
        self.requests: list[httpx.Request] = []
        self.states = states or [load("state")]
        self.down = False
        self.text_gone = False
        """Set to answer the request text as dropped (404), as the server does for an old one."""
        self.timeline_gone = False
        """Set to answer the timeline as dropped (404 naming the request)."""
        self.timelines = True
        """Unset to answer as a server older than the timelines: no such route."""
        self.timeline_body: dict[str, Any] = load("timeline")
        """The timeline served for its ``seq_id`` (a test may change it)."""
        self.routes: dict[tuple[str, str], Handler] = {
            ("GET", "/admin/state"): self._state,
            ("GET", "/admin/jobs"): reply("jobs"),
            ("GET", "/admin/policy"): reply("policy", headers={"ETag": '"3"'}),
            ("GET", "/admin/policy/schema"): reply("schema"),
            ("GET", "/admin/policy/history"): reply("history"),
            ("PUT", "/admin/policy"): self._put,
            ("POST", "/admin/policy/rollback/2"): reply("update_applied"),
            ("POST", "/admin/reclaim"): reply("reclaim"),
            ("GET", "/admin/schedules"): reply("schedules"),
            ("GET", "/admin/guardrail"): reply("guardrail"),
            ("GET", "/admin/guardrail/decisions"): reply("guardrail_decisions"),
            ("PUT", "/admin/guardrail"): self._put_guardrail,
        }

    def _last_state(self) -> dict[str, Any]:
        """The state served last (the first one before any is served)."""
        served = sum(1 for r in self.requests if r.url.path == "/admin/state")
        return self.states[max(min(served, len(self.states)) - 1, 0)]

    def _state(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=self._last_state())

    def _put(self, request: httpx.Request) -> httpx.Response:
        dry = request.url.params.get("dry_run") == "true"
        return reply("update_dry_run" if dry else "update_applied")(request)

    def _put_guardrail(self, request: httpx.Request) -> httpx.Response:
        """Stores the body as the next revision, as the server does (its status kept)."""
        body = json.loads(request.content)
        view = load("guardrail")
        view["config"] = {k: v for k, v in body.items() if k != "reason"}
        view.update(revision=view["revision"] + 1, actor="admin", reason=body["reason"])
        return httpx.Response(200, json=view)

    def _request_text(self, request: httpx.Request) -> httpx.Response:
        """``request_text`` for its own id; 409 when the last state served says the text is
        not exposed, 404 for any other id or once ``text_gone`` is set."""
        if not self._last_state().get("text_exposed", False):
            detail = "the server was started without --expose-text: it keeps no text"
            return httpx.Response(409, json={"detail": detail})
        body = load("request_text")
        if self.text_gone or request.url.path != f"/admin/requests/{body['id']}":
            return httpx.Response(404, json={"detail": "no request kept under that id"})
        return httpx.Response(200, json=body)

    def _timeline(self, request: httpx.Request) -> httpx.Response:
        """``timeline`` for its own id, 404 for any other id or once ``timeline_gone`` is
        set; an older server's framework 404 when ``timelines`` is unset."""
        if not self.timelines:
            return httpx.Response(404, json={"detail": "Not Found"})
        body = self.timeline_body
        if self.timeline_gone or request.url.path != f"/admin/requests/{body['seq_id']}/timeline":
            return httpx.Response(404, json={"detail": "no request kept under that id"})
        return httpx.Response(200, json=body)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.method == "GET" and request.url.path.startswith("/admin/requests/"):
            if request.url.path.endswith("/timeline"):
                return self._timeline(request)
            return self._request_text(request)
        handler = self.routes.get((request.method, request.url.path))
        if handler is None:
            return httpx.Response(404, json={"detail": "Not Found"})
        return handler(request)

    def changes(self) -> list[httpx.Request]:
        """Requests that would change the server (dry runs excluded)."""
        return [
            r for r in self.requests if r.method != "GET" and r.url.params.get("dry_run") != "true"
        ]

    def client(self, read_only: bool = False) -> HttpClient:
        return HttpClient(
            URL, TOKEN, read_only=read_only, transport=httpx.MockTransport(self.handle)
        )


REPLACEMENT = "w2hd81fe"
DIED = "ActorDiedError: The actor died unexpectedly before finishing this task.\n\tclass_name: ..."


def fleet_states() -> dict[str, dict[str, Any]]:
    """A 2-replica fleet (``state_fleet``) as the console sees one replica killed: ``up``;
    ``down`` (the second answers with an error); ``gone`` (Ray dropped it from the list);
    ``back`` (its replacement: a new id and pid, one version behind); ``converged``."""
    up = load("state_fleet")
    first, second = up["replicas"]

    def fleet(*replicas: dict[str, Any]) -> dict[str, Any]:
        state = copy.deepcopy(up)
        state["replicas"] = list(replicas)
        live = [r for r in replicas if r["up"]]
        totals = state["replica_totals"]
        totals.update(replicas=len(replicas), up=len(live))
        for key in ("waiting", "running", "free_blocks", "generation_tokens"):
            totals[key] = sum(r[key] for r in live)
        totals["versions"] = sorted({r["version"] for r in live})
        return state

    dead = {"replica": second["replica"], "up": False, "error": DIED}
    new = {**second, "replica": REPLACEMENT, "pid": 42117, "started_at": 1795950300.2}
    new.update(version=2, waiting=0, running=0, in_flight=0, generation_tokens=0)
    new["last_reclaim"] = None
    return {
        "up": up,
        "down": fleet(first, dead),
        "gone": fleet(first),
        "back": fleet(first, new),
        "converged": fleet(first, {**new, "version": 3}),
    }
