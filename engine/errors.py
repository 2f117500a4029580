"""Request refusals the server maps to HTTP answers (400 and 429)."""

from __future__ import annotations


class RequestRejected(ValueError):
    """A request that can never be served as asked; ``param`` names the offending field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class QueueFull(RuntimeError):
    """The bounded waiting queue is full; the client should retry later."""
