"""The text of recent requests, kept in memory for the console's detail view (``--expose-text``).

Prompt text is private by default: a server started without ``--expose-text`` builds no
journal at all (``Runtime.text`` is None), so nothing is recorded, not even kept and hidden.
With it, ``TextJournal`` keeps each engine sequence's prompt and the text it generates as it
streams, for the requests running now and the last ``FINISHED_KEPT`` finished ones; each text
is cut at ``MAX_TEXT_CHARS`` (the entry says so). Nothing is written anywhere else.

Entries are keyed by the engine's sequence id, the id ``/admin/state`` lists
(``RequestSnapshot.id``): a batch's prompts are requests of their own, and the forks of a request
with ``n`` > 1 are sequences of their own (``RequestOutput.seq_id``), each with its own entry and
the request's prompt. The prompt is what the model reads: a completion's text (token ids
decoded with the tokenizer), a chat's messages as the chat template rendered them.

The hook is the request's stream (``watched``): the routes read every output through it, streamed
or answered whole, so every text delta the engine made passes it once. A stream closed before its
sequences finished (the client went away, a failure) ends them as ``abort`` or ``error``; a stream
nobody reads to the end is settled by the engine's finished hook (``settle``), so no entry stays
running for ever. The event loop records, the admin route reads on a worker thread: one lock.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from control.schemas.requests import RequestText
from control.service.protocol import EngineStream
from engine.outputs import RequestOutput

FINISHED_KEPT = 16
"""Finished sequences kept (the oldest finished is dropped first); running ones are all kept."""
MAX_TEXT_CHARS = 64 * 1024
"""Characters kept of one sequence's prompt, and of its output (the first ones)."""


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class _Entry:
    seq_id: str
    request_id: str
    prompt: str
    prompt_chars: int
    started_at: datetime
    output: list[str] = field(default_factory=list)
    kept_chars: int = 0
    output_chars: int = 0
    finish_reason: str | None = None
    finished_at: datetime | None = None

    def append(self, delta: str, max_chars: int) -> None:
        room = max_chars - self.kept_chars
        if room > 0 and delta:
            kept = delta[:room]
            self.output.append(kept)
            self.kept_chars += len(kept)
        self.output_chars += len(delta)

    def view(self, max_chars: int) -> RequestText:
        return RequestText(
            id=self.seq_id,
            request_id=self.request_id,
            state="running" if self.finished_at is None else "finished",
            prompt=self.prompt,
            prompt_chars=self.prompt_chars,
            prompt_truncated=self.prompt_chars > len(self.prompt),
            output="".join(self.output),
            output_chars=self.output_chars,
            output_truncated=self.output_chars > self.kept_chars,
            max_chars=max_chars,
            finish_reason=self.finish_reason,
            started_at=self.started_at,
            finished_at=self.finished_at,
        )


class TextJournal:
    """Running sequences' text and the last ``finished_kept`` finished ones', by sequence id."""

    def __init__(
        self,
        finished_kept: int = FINISHED_KEPT,
        max_chars: int = MAX_TEXT_CHARS,
        clock: Callable[[], datetime] = _now,
    ) -> None:
        self.finished_kept = finished_kept
        self.max_chars = max_chars
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._running: dict[str, set[str]] = {}
        """The running sequence ids of each request."""
        self._finished: OrderedDict[str, None] = OrderedDict()
        """Finished sequence ids, oldest finished first."""
        self._lock = threading.Lock()

    def start(self, seq_id: str, request_id: str, prompt: str) -> None:
        """A sequence the engine took in (a fork: at its first output), running from now."""
        entry = _Entry(
            seq_id, request_id, prompt[: self.max_chars], len(prompt), started_at=self._clock()
        )
        with self._lock:
            self._finished.pop(seq_id, None)  # an id used again replaces its old entry
            self._entries[seq_id] = entry
            self._running.setdefault(request_id, set()).add(seq_id)

    def record(self, output: RequestOutput) -> None:
        """An output of a started sequence: its text delta, and its end when it finished."""
        with self._lock:
            entry = self._entries.get(output.seq_id)
            if entry is None:
                return
            entry.append(output.text_delta, self.max_chars)
            if output.finished:
                self._finish(entry, output.finish_reason)

    def settle(self, output: RequestOutput) -> None:
        """The engine's finished hook: a sequence whose stream is not read to its end (the
        text stays as far as the stream was read)."""
        with self._lock:
            entry = self._entries.get(output.seq_id)
            if entry is not None:
                self._finish(entry, output.finish_reason)

    def end(self, request_id: str, reason: str) -> None:
        """The request's stream closed: its sequences still running end with ``reason``."""
        with self._lock:
            for seq_id in sorted(self._running.get(request_id, ())):
                self._finish(self._entries[seq_id], reason)

    def get(self, seq_id: str) -> RequestText | None:
        with self._lock:
            entry = self._entries.get(seq_id)
            return None if entry is None else entry.view(self.max_chars)

    def _finish(self, entry: _Entry, reason: str | None) -> None:
        if entry.finished_at is not None:
            return
        entry.finish_reason, entry.finished_at = reason, self._clock()
        running = self._running.get(entry.request_id, set())
        running.discard(entry.seq_id)
        if not running:
            self._running.pop(entry.request_id, None)
        self._finished[entry.seq_id] = None
        while len(self._finished) > self.finished_kept:
            oldest, _ = self._finished.popitem(last=False)
            del self._entries[oldest]


class _Watched:
    """A request's stream that records its sequences' text in the journal as it is read."""

    def __init__(self, stream: EngineStream, journal: TextJournal, prompt: str) -> None:
        self.request_id = stream.request_id
        self._stream, self._journal, self._prompt = stream, journal, prompt
        self._seen: set[str] = set()

    async def admitted(self) -> None:
        await self._stream.admitted()
        self._start(self.request_id)  # the first sequence's id is the request's

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> RequestOutput:
        try:
            output = await self._stream.__anext__()
        except (StopAsyncIteration, asyncio.CancelledError):
            raise  # the end, or a read cancelled: aclose follows
        except Exception:
            self._journal.end(self.request_id, "error")
            raise
        if output.seq_id not in self._seen:  # a fork of n > 1, at its first output
            self._start(output.seq_id)
        self._journal.record(output)
        return output

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            self._journal.end(self.request_id, "abort")

    def _start(self, seq_id: str) -> None:
        self._seen.add(seq_id)
        self._journal.start(seq_id, self.request_id, self._prompt)


def watched(
    journal: TextJournal | None, stream: EngineStream, prompt: Callable[[], str]
) -> EngineStream:
    """``stream``, recording its text in ``journal``; as it is without one (``prompt`` is then
    never called: a token-id prompt is decoded only to be kept)."""
    return stream if journal is None else _Watched(stream, journal, prompt())
