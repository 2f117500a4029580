"""Per-request generation settings."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Literal

GREEDY_BELOW_TEMPERATURE = 1e-5
"""A temperature under this samples greedily: dividing logits by less overflows float32."""
MAX_N = 16
"""Most sequences one request may ask for (``n``): each holds its own KV blocks past the
shared prompt, so the bound keeps one request from taking the pool."""
MAX_LOGPROBS = 20
"""Most alternatives per token ``logprobs`` may ask for (as vLLM's default ``max_logprobs``)."""
SEED_MIN = -(1 << 63)
SEED_MAX = (1 << 64) - 1
"""The range ``torch.Generator.manual_seed`` accepts (a negative seed wraps modulo 2**64)."""


GrammarSource = Literal["json_object", "json_schema", "regex", "choice", "grammar", "tool_call"]


@dataclass(frozen=True, slots=True)
class GrammarConstraint:
    """The request's output must follow ``grammar``: llguidance's grammar text (as
    ``engine.grammar.json_schema_grammar`` writes it), from ``source`` (OpenAI's
    ``response_format`` type, vLLM's ``structured_outputs`` key, or a forced tool call).
    Plain data: it travels with the request (a fleet pickles it to a replica); each engine
    compiles it (``engine.grammar.Grammars``), cached by ``key``."""

    grammar: str
    source: GrammarSource = "json_schema"
    key: str = field(init=False, repr=False, compare=False)
    """The grammar's SHA-256 (the compiled grammars' cache key)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", hashlib.sha256(self.grammar.encode()).hexdigest())


@dataclass(slots=True)
class SamplingParams:
    """``temperature=0`` (or below ``GREEDY_BELOW_TEMPERATURE``) is greedy; ``seed`` gives the
    request its own random generator; ``top_k`` of 0 or -1 disables top-k.

    ``n`` sequences share the prompt's KV blocks (the prompt is computed once, then forked);
    sequence ``i`` samples with its own generator seeded ``seed + i`` when ``seed`` is set.
    ``logprobs=N`` gives every output token its log-probability and the ``N`` most likely
    tokens' (0: the chosen token's only), of the model's raw distribution (a log-softmax of the
    logits before temperature, top-k and top-p); None computes nothing. ``prompt_logprobs=N``
    does the same for the prompt's tokens from the second on (the request then takes no prefix
    cache hits: only positions the engine computes have logits). ``constraint``: the output
    follows a grammar (structured output, engine/grammar.py): each step the tokens it refuses
    are masked before sampling (logprobs are then of the masked distribution), and the
    sequence finishes with ``stop`` when the grammar ends."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    constraint: GrammarConstraint | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be >= -1 (0 or -1 disables it), got {self.top_k}")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise ValueError(
                f"seed must be in [{SEED_MIN}, {SEED_MAX}] (the range of a 64-bit generator "
                f"seed), got {self.seed}"
            )
        if not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be in [1, {MAX_N}], got {self.n}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_LOGPROBS:
            raise ValueError(
                f"prompt_logprobs must be in [0, {MAX_LOGPROBS}], got {self.prompt_logprobs}"
            )
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE
