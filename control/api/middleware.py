"""Pure ASGI middleware in front of every route (no request is parsed before it ran).

- A request id for each request: the client's ``X-Request-Id`` when it is sane (printable
  ASCII, at most ``REQUEST_ID_MAX_LEN``), else a new one. Every response echoes it, and log
  records made while the request is handled carry it (``RequestIdFilter``).
- The body size limit, on ``Content-Length`` and on the bytes actually received (413), and
  the JSON nesting limit, on the raw bytes (400): both before anything parses the body.
- On ``/v1``: one access log line per request (method, path, status, time, request id; never
  the body) and the counters of refused and failed requests.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from array import array
from itertools import accumulate
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control.api import errors
from control.api.request_context import RequestInfo, bind, unbind

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
REQUEST_ID_MAX_LEN = 128
_SANE_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,%d}" % REQUEST_ID_MAX_LEN)

_REASON_BY_STATUS = {
    400: "invalid",
    401: "unauthorized",
    404: "not_found",
    405: "invalid",
    413: "too_large",
    422: "invalid",
    429: "queue_full",
    503: "unavailable",
}
CLIENT_GONE = 499


def request_id_of(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            if _SANE_REQUEST_ID.fullmatch(value):
                raw: bytes = value  # ASGI header values are bytes
                return raw.decode("ascii")
            break
    return uuid.uuid4().hex


_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_OPENERS, _CLOSERS = b"[{", b"]}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _OPENERS + _CLOSERS)
_SIGNS = bytes.maketrans(_OPENERS + _CLOSERS, b"\x01\x01\xff\xff")


def json_depth_exceeds(body: bytes, limit: int) -> bool:
    """Whether the JSON text nests arrays/objects deeper than ``limit``, in linear time and
    without parsing it (escapes, then strings, are cut out; brackets are counted)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False  # the common case: too few brackets to nest that deep
    structure = _STRING.sub(b"", _ESCAPE.sub(b"", body)).translate(None, _NOT_BRACKETS)
    steps = array("b", structure.translate(_SIGNS))  # +1 per opener, -1 per closer
    return any(depth > limit for depth in accumulate(steps))


class BodyTooLarge(Exception):
    pass


class RequestGuard:
    """See the module docstring. ``metrics_of(scope)`` finds the counters (None while the
    app is starting)."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, max_json_depth: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        info = RequestInfo(request_id_of(scope))
        token = bind(info)
        status: int | None = None
        started = time.perf_counter()
        path = scope["path"]

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message).append(REQUEST_ID_HEADER, info.id)
            await send(message)

        try:
            try:
                body, disconnected = await self._read_body(scope, receive)
            except BodyTooLarge:
                message = f"the request body is larger than {self.max_body_bytes} bytes"
                response = errors.error_response(path, 413, message, code="request_too_large")
                await response(scope, receive, send_with_id)
                return
            if disconnected:
                return
            if json_depth_exceeds(body, self.max_json_depth):
                message = f"the JSON body nests deeper than {self.max_json_depth} levels"
                response = errors.error_response(path, 400, message, code="too_deeply_nested")
                await response(scope, receive, send_with_id)
                return
            try:
                await self.app(scope, _replay(body, receive), send_with_id)
            except Exception:
                if status is not None:
                    raise  # the response is under way: nothing else can be sent
                log.exception("request %s failed", info.id)
                response = errors.error_response(path, 500, "internal error", code="internal")
                await response(scope, receive, send_with_id)
        finally:
            if errors.is_public(path):
                self._account(scope, info, status, time.perf_counter() - started)
            unbind(token)

    async def _read_body(self, scope: Scope, receive: Receive) -> tuple[bytes, bool]:
        """The whole body (413 past the limit), and whether the client went away meanwhile."""
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
                raise BodyTooLarge
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"", True
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), False

    def _account(self, scope: Scope, info: RequestInfo, status: int | None, took: float) -> None:
        method, path = scope["method"], scope["path"]
        log.info("%s %s %s %.3fs request_id=%s", method, path, status or "-", took, info.id)
        if status is None or status < 400 or status == CLIENT_GONE:
            return
        metrics = _metrics_of(scope)
        if metrics is None:
            return
        if status >= 500 and status != 503:
            metrics.count_failed()
        else:
            metrics.count_refused(info.refusal or _REASON_BY_STATUS.get(status, "invalid"))


# Any: the app state's metrics, read from the ASGI scope (untyped there)
def _metrics_of(scope: Scope) -> Any:
    ctx = getattr(scope["app"].state, "ctx", None) if "app" in scope else None
    return None if ctx is None else ctx.metrics


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` that hands the body read already, then the client's further messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
