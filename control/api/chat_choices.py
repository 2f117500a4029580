"""The choices of a chat answer, whole (``chat.completion``) or as the chunks of a stream
(``chat.completion.chunk``), with OpenAI's chat logprobs (``logprobs.content[]``) built from
the engine's ``TokenLogprob`` entries (control/api/logprobs.py decodes the tokens)."""

from __future__ import annotations

from collections.abc import Iterable

from control.api.logprobs import TokenTexts, finite
from control.chat.schemas import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatDelta,
    ChatLogprobs,
    ChatTokenLogprob,
    TopLogprob,
)
from engine.front import EngineFront
from engine.outputs import RequestOutput, TokenLogprob


def chat_logprobs(entries: Iterable[TokenLogprob], texts: TokenTexts, top: int) -> ChatLogprobs:
    """OpenAI's ``logprobs.content``: per token its text, log-probability, UTF-8 bytes and the
    ``top`` most likely alternatives."""
    return ChatLogprobs(
        content=[
            ChatTokenLogprob(
                token=texts(entry.token_id),
                logprob=finite(entry.logprob),
                bytes=texts.utf8(entry.token_id),
                top_logprobs=[
                    TopLogprob(token=texts(tid), logprob=finite(lp), bytes=texts.utf8(tid))
                    for tid, lp in entry.top[:top]
                ],
            )
            for entry in entries
        ]
    )


class Render:
    """Choices of one request, whole or chunk by chunk (with each choice's logprobs since its
    last chunk)."""

    def __init__(self, body: ChatCompletionRequest, front: EngineFront) -> None:
        self.n = body.n
        self.want_logprobs = bool(body.logprobs)
        self.top = body.top_logprobs or 0
        self.texts = TokenTexts(front.tokenizer)
        self._pending: dict[int, list[TokenLogprob]] = {}

    def roles(self) -> list[list[ChatChunkChoice]]:
        """A stream's first chunks, sent at once: each choice's role (clients time the first
        token from the first chunk)."""
        return [
            [ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content=""))]
            for index in range(self.n)
        ]

    def _logprobs(self, entries: Iterable[TokenLogprob]) -> ChatLogprobs | None:
        return chat_logprobs(entries, self.texts, self.top) if self.want_logprobs else None

    def final(self, output: RequestOutput, index: int) -> ChatChoice:
        return ChatChoice(
            index=index,
            message=ChatCompletionMessage(content=output.text),
            logprobs=self._logprobs(output.logprobs or []),
            finish_reason=output.finish_reason,
            stop_reason=output.stop_reason,
        )

    def chunk(self, output: RequestOutput, index: int) -> ChatChunkChoice | None:
        """The choice's next chunk, or None while it has no text to send yet."""
        pending = self._pending.setdefault(index, [])
        pending.extend(output.new_logprobs or [])
        if not (output.text_delta or output.finished):
            return None
        choice = ChatChunkChoice(
            index=index,
            delta=ChatDelta(content=output.text_delta),
            logprobs=self._logprobs(pending),
            finish_reason=output.finish_reason,
            stop_reason=output.stop_reason if output.finished else None,
        )
        pending.clear()
        return choice
