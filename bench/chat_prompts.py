"""Real chat requests for a load: a file of short conversations, validated once at load, drawn
with the load generator's seeded rng (``bench.load``, ``servedeck load --chat-prompts FILE``).

The project ships one (``demo_prompts.json``, what ``servedeck serve --demo-load`` sends when
the served model has a chat template): about fifty requests a 135M instruct model answers
sensibly (facts, how-to, rewrites, lists, tiny poems, arithmetic, a few multi-turn), a third
of them behind one long system prompt (more than a dozen 16-token KV blocks), so the console
shows prefix caching at work: those requests share the system prompt's cached blocks.

The file names the shared system prompt once (``shared_system_prompt``) and the conversations
that start with it (``shared_system: true``); loading prepends it, so a drawn conversation is
the complete message list sent. ``temperature`` is the file's, one for all: the shipped file
says 0.7, because greedy decoding of a small model repeats itself and loops, and the same
prompt drawn twice may then show two different answers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SHIPPED_FILE = "demo_prompts.json"


class ChatMessage(BaseModel):
    """One turn, as OpenAI's chat API takes it (the file's subset: text content only)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str = Field(min_length=1)


class DemoConversation(BaseModel):
    """One chat request: its messages and how many tokens the answer may have at most."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    messages: tuple[ChatMessage, ...] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    shared_system: bool = Field(
        False, description="Starts with the file's shared system prompt (prepended at load)."
    )


class ChatPromptFile(BaseModel):
    """The file's shape (``demo_prompts.json``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = Field(ge=0.0, le=2.0)
    shared_system_prompt: str | None = None
    conversations: tuple[DemoConversation, ...] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class ChatPrompts:
    """The conversations a load sends, complete (the shared system prompt in place)."""

    conversations: tuple[DemoConversation, ...]
    temperature: float
    shared_system_prompt: str | None = None

    @classmethod
    def of(cls, data: ChatPromptFile) -> ChatPrompts:
        shared = data.shared_system_prompt
        if shared is None and any(c.shared_system for c in data.conversations):
            raise ValueError("a conversation has shared_system but the file no system prompt")
        system = ChatMessage(role="system", content=shared) if shared is not None else None
        conversations = tuple(
            c.model_copy(update={"messages": (system, *c.messages)})
            if c.shared_system and system is not None
            else c
            for c in data.conversations
        )
        return cls(conversations, data.temperature, shared)

    @classmethod
    def read(cls, path: Path) -> ChatPrompts:
        """A prompt file; a malformed one raises pydantic's ``ValidationError`` naming the field."""
        return cls.of(ChatPromptFile.model_validate_json(path.read_bytes()))

    @classmethod
    def shipped(cls) -> ChatPrompts:
        """The project's own set (package data beside this module)."""
        text = files(__package__ or "bench").joinpath(SHIPPED_FILE).read_bytes()
        return cls.of(ChatPromptFile.model_validate_json(text))

    def draw(self, rng: random.Random) -> DemoConversation:
        return rng.choice(self.conversations)
