"""The request in hand, per task (a ``ContextVar``): its id, for every log record made while it
is handled, and the reason an error handler gave for refusing it, for the counters."""

from __future__ import annotations

import contextvars
import logging
from dataclasses import dataclass


@dataclass
class RequestInfo:
    id: str
    refusal: str | None = None
    """The reason an error handler gave for refusing it (else derived from the status)."""


_current: contextvars.ContextVar[RequestInfo | None] = contextvars.ContextVar(
    "servedeck_request", default=None
)


def current_request_id() -> str | None:
    info = _current.get()
    return None if info is None else info.id


def note_refusal(reason: str) -> None:
    """Name why the current request is refused (the ``reason`` label it is counted under)."""
    info = _current.get()
    if info is not None:
        info.refusal = reason


class RequestIdFilter(logging.Filter):
    """Gives every record a ``request_id`` attribute ("-" outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = current_request_id() or "-"
        return True


def install_log_filter() -> None:
    """Put ``RequestIdFilter`` on the root logger's handlers (once each)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RequestIdFilter) for f in handler.filters):
            handler.addFilter(RequestIdFilter())


def bind(info: RequestInfo) -> contextvars.Token[RequestInfo | None]:
    """Make ``info`` the request in hand for this task (``unbind`` with the token after)."""
    return _current.set(info)


def unbind(token: contextvars.Token[RequestInfo | None]) -> None:
    _current.reset(token)
