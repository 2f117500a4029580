"""How the console talks to a server: one interface, one httpx implementation.

Tests inject recorded responses either through ``HttpClient(transport=httpx.MockTransport(...))``
(which also exercises the real request building) or by passing any object that satisfies
``ConsoleClient``.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar, runtime_checkable
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from tui.models import (
    AdminState,
    DecisionList,
    DemoLoadView,
    GuardrailView,
    HistoryPage,
    JobsView,
    PolicySchema,
    PolicyUpdateResult,
    PolicyView,
    ReclaimRun,
    RequestText,
    RequestTimeline,
    ScheduleList,
)

M = TypeVar("M", bound=BaseModel)


class ClientError(Exception):
    """Base of everything the client raises."""


class Unreachable(ClientError):
    """No usable answer: connection refused, timeout, 5xx or the model still loading."""


class ReadOnlyError(ClientError):
    """A call that would change the server, made by a read-only client."""


class ApiError(ClientError):
    """The server answered and refused: ``status`` and its ``detail``."""

    def __init__(self, status: int, detail: Any) -> None:
        self.status = status
        self.detail = detail
        super().__init__(self.message)

    @property
    def message(self) -> str:
        if isinstance(self.detail, str):
            return self.detail
        if isinstance(self.detail, list):
            return "; ".join(f"{loc_name(e.get('loc'))}: {e.get('msg')}" for e in self.detail)
        return f"HTTP {self.status}"

    @property
    def field_errors(self) -> dict[str, str]:
        """422 errors keyed by the field path under the body (``policy.params.max_batch_size``)."""
        if not isinstance(self.detail, list):
            return {}
        errors: dict[str, str] = {}
        for entry in self.detail:
            name = loc_name(entry.get("loc"))
            errors[name] = f"{errors[name]}; {entry.get('msg')}" if name in errors else entry["msg"]
        return errors


class Conflict(ApiError):
    """409: the policy moved on since the version we based the change on."""


def loc_name(loc: Any) -> str:
    parts = [str(p) for p in loc or ()]
    if parts and parts[0] in ("body", "query", "path"):
        parts = parts[1:]
    return ".".join(parts) or "request"


@runtime_checkable
class ConsoleClient(Protocol):
    url: str
    read_only: bool

    async def state(self) -> AdminState: ...
    async def jobs(self) -> JobsView: ...
    async def policy(self) -> PolicyView: ...
    async def schema(self) -> PolicySchema: ...
    async def history(self, offset: int = 0, limit: int = 20) -> HistoryPage: ...
    async def update_policy(
        self, update: dict[str, Any], *, if_match: int | None, dry_run: bool = False
    ) -> PolicyUpdateResult: ...
    async def rollback(
        self, version: int, reason: str, *, if_match: int | None
    ) -> PolicyUpdateResult: ...
    async def reclaim(self) -> ReclaimRun: ...
    async def demo_load(self) -> DemoLoadView: ...
    async def set_demo_load(self, rate: float) -> DemoLoadView: ...
    async def schedules(self) -> ScheduleList: ...
    async def guardrail(self) -> GuardrailView: ...
    async def guardrail_decisions(self, limit: int = 10) -> DecisionList: ...
    async def update_guardrail(self, update: dict[str, Any]) -> GuardrailView: ...
    async def request_text(self, seq_id: str) -> RequestText: ...
    async def request_timeline(self, seq_id: str) -> RequestTimeline: ...
    async def aclose(self) -> None: ...


class HttpClient:
    """The admin API over httpx. Every admin call carries the bearer token."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        read_only: bool = False,
        actor: str | None = None,
        timeout_s: float = 3.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.read_only = read_only
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if actor:
            headers["X-Servedeck-Actor"] = actor
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=timeout_s, transport=transport
        )

    async def _call(
        self,
        method: str,
        path: str,
        model: type[M],
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[M, httpx.Response]:
        if method != "GET" and self.read_only:
            raise ReadOnlyError(f"read-only console: refusing {method} {path}")
        try:
            response = await self._http.request(
                method, path, json=json, params=params, headers=headers
            )
        except httpx.TransportError as exc:
            # a timeout's message is empty: say what it means
            raise Unreachable(f"{type(exc).__name__}: {str(exc) or 'no answer'}") from exc
        if response.status_code >= 500:
            raise Unreachable(f"HTTP {response.status_code}: {_detail(response)}")
        if response.status_code >= 400:
            cls = Conflict if response.status_code == 409 else ApiError
            raise cls(response.status_code, _detail(response))
        try:
            return model.model_validate(response.json()), response
        except (ValueError, ValidationError) as exc:
            raise ApiError(response.status_code, f"unexpected answer to {path}: {exc}") from exc

    async def state(self) -> AdminState:
        return (await self._call("GET", "/admin/state", AdminState))[0]

    async def jobs(self) -> JobsView:
        return (await self._call("GET", "/admin/jobs", JobsView))[0]

    async def policy(self) -> PolicyView:
        view, response = await self._call("GET", "/admin/policy", PolicyView)
        view.etag = response.headers.get("etag")
        return view

    async def schema(self) -> PolicySchema:
        return (await self._call("GET", "/admin/policy/schema", PolicySchema))[0]

    async def history(self, offset: int = 0, limit: int = 20) -> HistoryPage:
        params = {"offset": offset, "limit": limit}
        return (await self._call("GET", "/admin/policy/history", HistoryPage, params=params))[0]

    async def update_policy(
        self, update: dict[str, Any], *, if_match: int | None, dry_run: bool = False
    ) -> PolicyUpdateResult:
        return (
            await self._call(
                "PUT",
                "/admin/policy",
                PolicyUpdateResult,
                json=update,
                params={"dry_run": "true"} if dry_run else None,
                headers=_if_match(if_match),
            )
        )[0]

    async def rollback(
        self, version: int, reason: str, *, if_match: int | None
    ) -> PolicyUpdateResult:
        return (
            await self._call(
                "POST",
                f"/admin/policy/rollback/{version}",
                PolicyUpdateResult,
                json={"reason": reason} if reason else {},
                headers=_if_match(if_match),
            )
        )[0]

    async def reclaim(self) -> ReclaimRun:
        return (await self._call("POST", "/admin/reclaim", ReclaimRun))[0]

    async def demo_load(self) -> DemoLoadView:
        return (await self._call("GET", "/admin/demo-load", DemoLoadView))[0]

    async def set_demo_load(self, rate: float) -> DemoLoadView:
        """0 pauses the server's demo load; any other rate resumes it at that rate."""
        body = {"rate": rate}
        return (await self._call("PUT", "/admin/demo-load", DemoLoadView, json=body))[0]

    async def schedules(self) -> ScheduleList:
        return (await self._call("GET", "/admin/schedules", ScheduleList))[0]

    async def guardrail(self) -> GuardrailView:
        return (await self._call("GET", "/admin/guardrail", GuardrailView))[0]

    async def guardrail_decisions(self, limit: int = 10) -> DecisionList:
        params = {"limit": limit}
        path = "/admin/guardrail/decisions"
        return (await self._call("GET", path, DecisionList, params=params))[0]

    async def update_guardrail(self, update: dict[str, Any]) -> GuardrailView:
        """PUT the whole config document (``GuardrailUpdate``: the config plus a reason)."""
        return (await self._call("PUT", "/admin/guardrail", GuardrailView, json=update))[0]

    async def request_text(self, seq_id: str) -> RequestText:
        """One request's prompt and output (409 from a server without ``--expose-text``, 404
        once its text is dropped); a fork's ``#`` goes in the path encoded."""
        path = f"/admin/requests/{quote(seq_id, safe='')}"
        return (await self._call("GET", path, RequestText))[0]

    async def request_timeline(self, seq_id: str) -> RequestTimeline:
        """One request's timeline and why it waited (no text: no ``--expose-text`` needed;
        404 for an unknown or dropped id, and from a server older than the route)."""
        path = f"/admin/requests/{quote(seq_id, safe='')}/timeline"
        return (await self._call("GET", path, RequestTimeline))[0]

    async def aclose(self) -> None:
        await self._http.aclose()


def _if_match(version: int | None) -> dict[str, str] | None:
    return None if version is None else {"If-Match": f'"{version}"'}


def _detail(response: httpx.Response) -> Any:
    try:
        body = response.json()
    except ValueError:
        return response.text or response.reason_phrase
    return body.get("detail", body) if isinstance(body, dict) else body
