"""The engine's front: what admission needs (the tokenizer, the limits, the checks) and none
of the weights.

``LLMEngine`` owns one (``engine.front``) and admits through it. ``EngineFront.from_config``
builds one from a config alone: it reads the model's config (``config.json``, or a GGUF
file's metadata) and its tokenizer, never a weight tensor, and computes the limits the engine
that config builds would have on this machine (``engine.kv_budget``: one definition for
both). A fleet's control plane admits with such a front while the replicas hold the weights.

What it reads of the checkpoint (model config, tokenizer, stop tokens) comes from
``engine.checkpoint_parts``, as the builder's does: an HF folder's front imports no torch; a
GGUF file's does, as does a random preset's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from engine.admission import check_request, check_text_size, max_prompt_bytes
from engine.checkpoint_parts import RandomWeights, checkpoint_parts, preset_parts
from engine.config import EngineConfig, EngineLimits
from engine.errors import RequestRejected
from engine.grammar import GrammarError, Grammars
from engine.kv_budget import kv_limits
from engine.parallel.shard import Shard, check_divisible
from engine.sampling_params import SamplingParams
from engine.tenants import (
    DEFAULT_PRIORITY,
    DEFAULT_TENANT,
    MAX_PRIORITY,
    MAX_TENANT_NAME,
    MIN_PRIORITY,
)

Prompt = str | list[int]


@dataclass(frozen=True, slots=True)
class QueuedPrompt:
    """One prompt as the engine queues it: its token ids, its params and its own request id.
    A batch (``LLMEngine.add_requests``, ``EngineService.add_requests``) is a sequence of them:
    each prompt is a request of its own, and the batch is admitted whole or not at all."""

    token_ids: list[int]
    params: SamplingParams
    request_id: str
    priority: int = DEFAULT_PRIORITY
    """Lower is served earlier (vLLM's meaning), where the queue discipline orders by it."""
    tenant: str = DEFAULT_TENANT
    """Who the request belongs to (the fair queue's unit; engine/tenants.py)."""


def request_ids(batch: Sequence[QueuedPrompt]) -> list[str]:
    """The batch's request ids; ``RequestRejected`` when one repeats (each names a stream)."""
    ids = [prompt.request_id for prompt in batch]
    if len(set(ids)) != len(ids):
        repeated = next(rid for rid in ids if ids.count(rid) > 1)
        raise RequestRejected(f"request id {repeated!r} is given twice in one batch", "request_id")
    return ids


class EngineFront:
    """Tokenize a prompt and refuse a request that can never be served (thread-safe: it holds
    no live state; the pool is checked by its size and the memory reserve in force)."""

    def __init__(
        self,
        config: EngineConfig,
        limits: EngineLimits,
        tokenizer: Tokenizer | None = None,
        eos_token_ids: tuple[int, ...] | frozenset[int] = (),
        vocab_size: int | None = None,
    ) -> None:
        self.config = config
        """The engine's config; ``memory_reserve`` is read at each check (a switch moves it)."""
        self.limits = limits
        self.tokenizer = tokenizer
        self.max_prompt_bytes = (
            0 if tokenizer is None else max_prompt_bytes(tokenizer, limits.max_model_len)
        )
        """UTF-8 bytes of text past which a prompt cannot fit (computed once, at build)."""
        self.eos_token_ids = frozenset(eos_token_ids)
        self.vocab_size = vocab_size
        self.grammars = (
            None if tokenizer is None else Grammars(tokenizer, vocab_size, self.eos_token_ids)
        )
        """Structured output's compiled grammars (engine/grammar.py); None without a
        tokenizer."""

    @classmethod
    def from_config(
        cls, config: EngineConfig, random_weights: RandomWeights | None = None
    ) -> EngineFront:
        """The front of the engine ``LLMEngine.from_config(config)`` builds (with
        ``random_weights``: of that preset's, as ``load_bundle`` builds it), without its
        weights. Raises as the engine's build would for a missing tokenizer, a tensor-parallel
        size that does not divide the heads, or a ``max_model_len`` beyond the model's."""
        tokenizer: Tokenizer | None
        if random_weights is not None:
            model, tokenizer, eos = preset_parts(random_weights.preset)
        else:
            model, tokenizer, eos = checkpoint_parts(config)
        shard = Shard(0, config.tensor_parallel_size)
        if shard.parallel:
            check_divisible(model, shard.world_size)
        limits = kv_limits(config, model, shard, weights_resident=False)
        return cls(config, limits, tokenizer, eos, model.vocab_size)

    def tokenize(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt. Text that cannot fit ``max_model_len`` is refused before it
        is tokenized; ``encode_batch`` releases the GIL while it works (``encode`` does not),
        so a server calling this on a worker thread keeps answering meanwhile."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestRejected("this model has no tokenizer: send token ids", "prompt")
            check_text_size(prompt, self.max_prompt_bytes, self.limits.max_model_len)
            return self.tokenizer.encode_batch([prompt])[0].ids
        return list(prompt)

    def check_request(self, token_ids: list[int], params: SamplingParams) -> None:
        """Raise ``RequestRejected`` (naming the field) for a request that can never be served."""
        check_request(token_ids, params, self.limits, self.config.memory_reserve, self.vocab_size)
        if params.constraint is not None:
            self.check_constraint(params)

    def check_constraint(self, params: SamplingParams) -> None:
        """The request's grammar compiles (a cache hit where the server compiled it first, off
        its event loop); ``RequestRejected`` naming ``response_format`` where it does not."""
        constraint = params.constraint
        if constraint is None:
            return
        if self.grammars is None:
            raise RequestRejected(
                "this model has no tokenizer: structured output needs one", "response_format"
            )
        try:
            self.grammars.compile(constraint)
        except GrammarError as exc:
            raise RequestRejected(f"the grammar cannot be used: {exc}", "response_format") from None

    def check_batch(self, batch: Sequence[QueuedPrompt]) -> None:
        """``check_request`` for every prompt: one that can never be served refuses the whole
        batch, naming which prompt it is."""
        for index, prompt in enumerate(batch):
            try:
                check_owner(prompt)
                self.check_request(prompt.token_ids, prompt.params)
            except RequestRejected as exc:
                raise exc.in_batch(index, len(batch)) from None


def check_owner(prompt: QueuedPrompt) -> None:
    """``RequestRejected`` for a priority out of bounds or a tenant name that is empty or too
    long (a server validates both at its edge; this is the in-process caller's)."""
    if not MIN_PRIORITY <= prompt.priority <= MAX_PRIORITY:
        raise RequestRejected(
            f"priority must be in [{MIN_PRIORITY}, {MAX_PRIORITY}], got {prompt.priority}",
            "priority",
        )
    if not 0 < len(prompt.tenant) <= MAX_TENANT_NAME:
        raise RequestRejected(f"tenant name must have 1 to {MAX_TENANT_NAME} characters", "tenant")
