"""Admission limits: the requests the engine refuses at once because they can never be served
(empty, token ids outside the vocabulary, longer than ``max_model_len``, larger than the KV
pool above its reserve). Each refusal names the field to blame."""

from __future__ import annotations

from engine.config import EngineLimits
from engine.errors import RequestRejected
from engine.kv_cache import BlockManager
from engine.sampling_params import SamplingParams


def check_request(
    token_ids: list[int],
    params: SamplingParams,
    limits: EngineLimits,
    blocks: BlockManager,
    vocab_size: int | None,
) -> None:
    """Raise ``RequestRejected`` (naming the field) for a request that can never be served."""
    if not token_ids:
        raise RequestRejected("prompt is empty", "prompt")
    if vocab_size is not None and not all(0 <= t < vocab_size for t in token_ids):
        raise RequestRejected(f"prompt token ids must be in [0, {vocab_size})", "prompt")
    max_len = limits.max_model_len
    if len(token_ids) >= max_len:
        raise RequestRejected(
            f"prompt has {len(token_ids)} tokens; max_model_len is {max_len} "
            "(the prompt and at least one generated token must fit)",
            "prompt",
        )
    admissible = blocks.num_blocks - blocks.reserved
    if blocks.blocks_for(len(token_ids) + 1) > admissible:
        raise RequestRejected(
            f"prompt has {len(token_ids)} tokens but the KV pool admits at most "
            f"{admissible * limits.block_size} ({admissible} blocks of "
            f"{limits.block_size} above the memory reserve)",
            "prompt",
        )
    if len(token_ids) + params.max_tokens > max_len:
        raise RequestRejected(
            f"max_tokens={params.max_tokens} with a prompt of {len(token_ids)} tokens asks "
            f"for {len(token_ids) + params.max_tokens} tokens; max_model_len is {max_len} "
            "(reduce the prompt or max_tokens)",
            "max_tokens",
        )
