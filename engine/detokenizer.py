"""Incremental detokenization and stop-string matching.

Decoding one token at a time is wrong for byte-level BPE (a character can span tokens) and
for SentencePiece (a token's leading space depends on its neighbour), so each step decodes a
short window and emits only the text that became stable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenizers import Tokenizer

CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"


@dataclass(slots=True)
class IncrementalDetokenizer:
    tokenizer: Tokenizer
    stop: list[str]
    prefix_offset: int
    read_offset: int
    text: str = ""
    emitted: int = 0
    _holdback: int = field(init=False)

    @classmethod
    def for_prompt(
        cls, tokenizer: Tokenizer, prompt_len: int, stop: list[str]
    ) -> IncrementalDetokenizer:
        return cls(tokenizer, stop, max(prompt_len - CONTEXT_TOKENS, 0), prompt_len)

    def __post_init__(self) -> None:
        self._holdback = max((len(s) for s in self.stop), default=1) - 1

    def update(self, token_ids: list[int]) -> str | None:
        """Decode the newest token; return the stop string it completed, if any."""
        prefix = self.tokenizer.decode(token_ids[self.prefix_offset : self.read_offset])
        window = self.tokenizer.decode(token_ids[self.prefix_offset :])
        if len(window) <= len(prefix) or window.endswith(REPLACEMENT_CHAR):
            return None
        delta = window[len(prefix) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(token_ids)
        start = len(self.text)
        self.text += delta
        for stop in self.stop:
            index = self.text.find(stop, max(0, start - len(stop) + 1))
            if index != -1:
                self.text = self.text[:index]
                return stop
        return None

    def take_delta(self, finished: bool) -> str:
        """Text not sent yet; holds back a tail that could still become a stop string."""
        end = len(self.text) if finished else max(len(self.text) - self._holdback, self.emitted)
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta
