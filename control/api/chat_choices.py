"""The choices of a chat answer, whole (``chat.completion``) or as the chunks of a stream
(``chat.completion.chunk``), with OpenAI's chat logprobs (``logprobs.content[]``) built from
the engine's ``TokenLogprob`` entries (control/api/logprobs.py decodes the tokens), and, for
a request with tools, the model's calls parsed out of its text (control/chat/tools.py) into
``tool_calls`` (``finish_reason`` ``tool_calls``; streamed, whole in the choice's last
chunk)."""

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
    ChatToolCall,
    ChatToolCallDelta,
    FunctionCall,
    TopLogprob,
)
from control.chat.tools import ParsedAnswer, ToolCallParser, ToolFormat, parse_answer
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
    last chunk). With ``tools`` (the call format, for a request whose tools are on), each
    choice's text is parsed for calls; without ``parallel``, only its first call is kept."""

    def __init__(
        self,
        body: ChatCompletionRequest,
        front: EngineFront,
        tools: ToolFormat | None = None,
        parallel: bool = True,
    ) -> None:
        self.n = body.n
        self.want_logprobs = bool(body.logprobs)
        self.top = body.top_logprobs or 0
        self.texts = TokenTexts(front.tokenizer)
        self.tools = tools
        self.parallel = parallel
        self._pending: dict[int, list[TokenLogprob]] = {}
        self._parsers: dict[int, ToolCallParser] = {}

    def roles(self) -> list[list[ChatChunkChoice]]:
        """A stream's first chunks, sent at once: each choice's role (clients time the first
        token from the first chunk)."""
        return [
            [ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content=""))]
            for index in range(self.n)
        ]

    def _logprobs(self, entries: Iterable[TokenLogprob]) -> ChatLogprobs | None:
        return chat_logprobs(entries, self.texts, self.top) if self.want_logprobs else None

    def _calls(self, answer: ParsedAnswer) -> list[ChatToolCall]:
        calls = answer.calls if self.parallel else answer.calls[:1]
        return [
            ChatToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))
            for c in calls
        ]

    @staticmethod
    def _finish(output: RequestOutput, calls: list[ChatToolCall]) -> str | None:
        """``tool_calls`` for an answer that made calls and ended by itself."""
        return "tool_calls" if calls and output.finish_reason == "stop" else output.finish_reason

    def final(self, output: RequestOutput, index: int) -> ChatChoice:
        if self.tools is None:
            message = ChatCompletionMessage(content=output.text)
            finish = output.finish_reason
        else:
            answer = parse_answer(output.text, self.tools)
            calls = self._calls(answer)
            message = ChatCompletionMessage(content=answer.content, tool_calls=calls or None)
            finish = self._finish(output, calls)
        return ChatChoice(
            index=index,
            message=message,
            logprobs=self._logprobs(output.logprobs or []),
            finish_reason=finish,
            stop_reason=output.stop_reason,
        )

    def chunk(self, output: RequestOutput, index: int) -> ChatChunkChoice | None:
        """The choice's next chunk, or None while it has no text to send yet (with tools:
        the text that may be a call is held until the choice ends)."""
        pending = self._pending.setdefault(index, [])
        pending.extend(output.new_logprobs or [])
        content = output.text_delta
        calls: list[ChatToolCall] = []
        if self.tools is not None:
            parser = self._parsers.setdefault(index, ToolCallParser(self.tools))
            content = parser.feed(output.text_delta or "")
            if output.finished:
                rest = parser.finish()
                content += rest.content or ""
                calls = self._calls(rest)
        if not (content or output.finished):
            return None
        deltas = [
            ChatToolCallDelta(index=i, id=c.id, function=c.function) for i, c in enumerate(calls)
        ]
        choice = ChatChunkChoice(
            index=index,
            delta=ChatDelta(content=content, tool_calls=deltas or None),
            logprobs=self._logprobs(pending),
            finish_reason=self._finish(output, calls) if output.finished else None,
            stop_reason=output.stop_reason if output.finished else None,
        )
        pending.clear()
        return choice
