"""Request refusals the server maps to HTTP answers (400 and 429), a request's failures in the
engine (its stream ends with one), and checkpoint errors."""

from __future__ import annotations

from pathlib import Path


class RequestRejected(ValueError):
    """A request that can never be served as asked; ``param`` names the offending field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param

    def in_batch(self, index: int, size: int) -> RequestRejected:
        """The same refusal for prompt ``index`` of a batch of ``size``: the whole batch is
        refused, and the message says which prompt (a batch of one reads as a request)."""
        if size == 1:
            return self
        return RequestRejected(f"{self} (prompt {index} of the {size} in the batch)", self.param)


class QueueFull(RuntimeError):
    """The bounded waiting queue is full; the client should retry later."""


class QuotaExceeded(QueueFull):
    """A tenant's share of the waiting queue is full (the fair queue's quota): its neighbours
    still get in."""

    def __init__(self, tenant: str, queued: int, quota: int) -> None:
        super().__init__(
            f"tenant {tenant!r} has {queued} requests waiting; its share of the queue is {quota}"
        )
        self.tenant = tenant


class CheckpointError(ValueError):
    """A checkpoint folder the engine cannot load: a missing file, an unsupported architecture
    or setting, a tensor of the wrong shape. The message names the file, the architecture or
    the ``config.json`` key; ``path`` is the folder or file concerned."""

    def __init__(self, message: str, path: str | Path) -> None:
        super().__init__(message)
        self.path = Path(path)


class EngineStepError(RuntimeError):
    """The engine failed while running this request; the request was aborted."""


class RequestFailed(EngineStepError):
    """This request alone failed in a step (its sampling row); its neighbours kept running."""

    def __init__(self, request_id: str, message: str) -> None:
        super().__init__(message)
        self.request_id = request_id


class EngineStopped(RuntimeError):
    """The engine shut down before this request finished."""
