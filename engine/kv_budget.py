"""How many KV blocks a config's pool holds, and the limits that gives the engine.

One definition for both sides: ``build_runner`` (engine/builder.py) sizes the pool it
allocates with it, around weights already resident; ``EngineFront.from_config``
(engine/front.py) computes the same limits from the model config alone, counting the weights
it does not load from their shapes. Nothing here imports torch but the CUDA branch, which
asks the device for its free memory.
"""

from __future__ import annotations

import math

from engine.config import CPU_KV_CACHE_BYTES, EngineConfig, EngineLimits
from engine.model.config import ModelConfig
from engine.parallel.shard import Shard

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of each ``EngineConfig.dtype``."""
ACTIVATION_BYTES_PER_TOKEN = 64 * 1024
"""CUDA: room kept free per batched token for the activations of the largest step."""


def reserved_blocks(num_blocks: int, memory_reserve: float) -> int:
    """Blocks of a pool of ``num_blocks`` that admission of new work must leave alone."""
    return math.ceil(memory_reserve * num_blocks - 1e-9)


def kv_block_bytes(
    num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, element_size: int
) -> int:
    """Bytes one block takes over every layer (K and V)."""
    return 2 * num_layers * block_size * num_kv_heads * head_dim * element_size


def weight_bytes(model: ModelConfig, shard: Shard, element_size: int) -> int:
    """Bytes of one rank's weights in the engine's dtype, counted from the shapes the decoder
    (engine/model/llama.py) allocates: split layers hold ``shard``'s part, embeddings whole."""
    hidden, head_dim = model.hidden_size, model.head_dim
    q = shard.part(model.num_attention_heads) * head_dim
    kv = shard.part(model.num_key_value_heads) * head_dim
    inter = shard.part(model.intermediate_size)
    qkv_rows = q + 2 * kv
    layer = (
        qkv_rows * hidden
        + (qkv_rows if model.attention_bias else 0)
        + hidden * q
        + (hidden if model.o_proj_bias else 0)
        + 3 * inter * hidden
        + 2 * hidden
        + (2 * head_dim if model.qk_norm else 0)
    )
    embeddings = model.vocab_size * hidden * (1 if model.tie_word_embeddings else 2)
    return (model.num_hidden_layers * layer + embeddings + hidden) * element_size


def num_kv_blocks(config: EngineConfig, block_bytes: int, weights_to_load: int = 0) -> int:
    """``config.num_kv_blocks`` when given. Else, on CPU, a bounded budget; on CUDA, what is
    left of the memory share once the weights are resident (``weights_to_load``: bytes of
    weights not loaded yet, as the front counts them), minus room for the activations of the
    largest step."""
    if config.num_kv_blocks:
        return config.num_kv_blocks
    if config.device.partition(":")[0] != "cuda":
        return max(1, CPU_KV_CACHE_BYTES // block_bytes)
    import torch  # only a CUDA pool asks the device

    free, total = torch.cuda.mem_get_info(torch.device(config.device))
    usable = free - weights_to_load - (1 - config.gpu_memory_utilization) * total
    activations = config.max_num_batched_tokens * ACTIVATION_BYTES_PER_TOKEN
    return max(1, int((usable - activations) // block_bytes))


def kv_limits(
    config: EngineConfig, model: ModelConfig, shard: Shard, weights_resident: bool = True
) -> EngineLimits:
    """The limits of the pool ``config`` gives ``model`` on this machine (``weights_resident``
    False: the weights are counted from their shapes, not measured). Raises ``ValueError``
    for a ``max_model_len`` beyond the model's positions."""
    element = DTYPE_BYTES[config.weights_dtype]
    per_block = kv_block_bytes(
        model.num_hidden_layers,
        config.block_size,
        shard.part(model.num_key_value_heads),
        model.head_dim,
        element,
    )
    to_load = 0 if weights_resident else weight_bytes(model, shard, element)
    num_blocks = num_kv_blocks(config, per_block, to_load)
    max_model_len = config.max_model_len or model.max_position_embeddings
    if max_model_len > model.max_position_embeddings:
        raise ValueError(
            f"max_model_len={max_model_len} exceeds the model's "
            f"max_position_embeddings={model.max_position_embeddings}"
        )
    return EngineLimits(
        block_size=config.block_size,
        num_kv_blocks=num_blocks,
        max_model_len=min(max_model_len, num_blocks * config.block_size),
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
    )
