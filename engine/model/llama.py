"""Llama decoder over a packed batch: ``[num_tokens, hidden]`` in, no padding dimension.

One decoder for every family (Llama, Mistral, Qwen2, Qwen3): the model config's switches add
q/k/v and o biases and Qwen3's per-head q/k RMSNorm; ``head_dim`` need not be hidden/heads.

Q/K/V and gate/up projections are fused at load time (one matrix product each instead of
three and two): on CPU every dispatched op costs, and a wider product runs closer to peak.

Tensor parallelism (``engine.parallel``): with a ``Shard`` of K ranks each rank holds its
heads' rows of q/k/v and its columns of gate/up (column-parallel), and the matching columns of
o_proj and down (row-parallel: partial sums, all-reduced, the bias added once). Embedding,
norms and lm_head are whole on every rank, so after each layer every rank holds the same
hidden states and rank 0 samples with no gather. With one rank nothing changes.
"""

from __future__ import annotations

from typing import TypeVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from engine.model.config import ModelConfig
from engine.model.products import PLAIN, Product, ProductPlan
from engine.model.rope import RopeTables, RotaryEmbedding, rotate_
from engine.parallel.shard import SINGLE, Shard
from kernels.attention import AttentionBackend, AttentionMetadata

MetaT = TypeVar("MetaT", bound=AttentionMetadata)
"""The attention backend's own metadata: ``prepare`` makes it, every layer reads it."""


def _param(*shape: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _param(size, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def _row_parallel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """This rank's columns of a row-parallel projection, summed over the ranks; bias once."""
    out = F.linear(x, weight)
    dist.all_reduce(out)
    return out if bias is None else out + bias


class Attention(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer_index: int,
        dtype: torch.dtype,
        device: torch.device,
        shard: Shard = SINGLE,
    ) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = shard.part(config.num_attention_heads)
        self.num_kv_heads = shard.part(config.num_key_value_heads)
        self.reduce = shard.parallel
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        qkv_rows = self.q_size + 2 * self.kv_size
        self.qkv_proj = _param(qkv_rows, config.hidden_size, dtype=dtype, device=device)
        self.qkv_bias = (
            _param(qkv_rows, dtype=dtype, device=device) if config.attention_bias else None
        )
        self.o_proj = _param(config.hidden_size, self.q_size, dtype=dtype, device=device)
        self.o_bias = (
            _param(config.hidden_size, dtype=dtype, device=device) if config.o_proj_bias else None
        )
        norm = (config.head_dim, config.rms_norm_eps, dtype, device)
        self.q_norm = RMSNorm(*norm) if config.qk_norm else None
        self.k_norm = RMSNorm(*norm) if config.qk_norm else None
        self.prepare_products(PLAIN)

    def prepare_products(self, plan: ProductPlan) -> None:
        """The projections' products over the loaded weights (``engine.model.products``)."""
        self.qkv = Product(self.qkv_proj, self.qkv_bias, plan)
        self.o = Product(self.o_proj, self.o_bias, PLAIN if self.reduce else plan)

    def forward(
        self,
        x: torch.Tensor,
        rope: RopeTables,
        attention: AttentionBackend[MetaT],
        meta: MetaT,
    ) -> torch.Tensor:
        tokens = x.shape[0]
        qkv = self.qkv(x)
        q, k, v = qkv.split_with_sizes([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
            rotate_(q, rope)
            rotate_(k, rope)
        else:
            # q and k sit side by side in the product: one in-place rotation covers both
            qk = qkv[:, : self.q_size + self.kv_size]
            rotate_(qk.view(tokens, self.num_heads + self.num_kv_heads, self.head_dim), rope)
        out = attention.forward(self.layer_index, q, k, v, meta, self.scale)
        if self.reduce:
            return _row_parallel(out.reshape(tokens, self.q_size), self.o_proj, self.o_bias)
        return self.o(out.reshape(tokens, self.q_size))


class MLP(nn.Module):
    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, shard: Shard = SINGLE
    ) -> None:
        super().__init__()
        size = shard.part(config.intermediate_size)
        self.reduce = shard.parallel
        self.gate_up_proj = _param(2 * size, config.hidden_size, dtype=dtype, device=device)
        self.down_proj = _param(config.hidden_size, size, dtype=dtype, device=device)
        self.prepare_products(PLAIN)

    def prepare_products(self, plan: ProductPlan) -> None:
        """The projections' products over the loaded weights (``engine.model.products``)."""
        self.gate_up = Product(self.gate_up_proj, None, plan)
        self.down = Product(self.down_proj, None, PLAIN if self.reduce else plan)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        # SiLU and the product in place in the gate half of the product's own buffer: no
        # fresh [tokens, intermediate] tensors (at 2,048 tokens two of them cost more than
        # the norms and rope together); down_proj reads the strided half as it is.
        hidden = F.silu(gate, inplace=True).mul_(up)
        if self.reduce:
            return _row_parallel(hidden, self.down_proj, None)
        return self.down(hidden)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer_index: int,
        dtype: torch.dtype,
        device: torch.device,
        shard: Shard = SINGLE,
    ) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, dtype, device)
        self.self_attn = Attention(config, layer_index, dtype, device, shard)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, dtype, device)
        self.mlp = MLP(config, dtype, device, shard)

    def forward(
        self,
        x: torch.Tensor,
        rope: RopeTables,
        attention: AttentionBackend[MetaT],
        meta: MetaT,
    ) -> torch.Tensor:
        """Adds to ``x`` in place (the residual stream is the model's own buffer)."""
        x.add_(self.self_attn(self.input_layernorm(x), rope, attention, meta))
        return x.add_(self.mlp(self.post_attention_layernorm(x)))


class LlamaForCausalLM(nn.Module):
    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, shard: Shard = SINGLE
    ) -> None:
        super().__init__()
        self.config = config
        self.shard = shard
        """The slice of every split layer this rank holds (``SINGLE``: the whole model)."""
        self.embed_tokens = _param(
            config.vocab_size, config.hidden_size, dtype=dtype, device=device
        )
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, dtype, device, shard) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else _param(config.vocab_size, config.hidden_size, dtype=dtype, device=device)
        )
        self.rope = RotaryEmbedding(
            config.head_dim,
            config.max_position_embeddings,
            config.rope_theta,
            config.rope_scaling,
            device,
        )
        self.head = Product(self.embed_tokens if self.lm_head is None else self.lm_head)

    def prepare_products(self, plan: ProductPlan) -> None:
        """Every projection's product over the loaded weights, by ``plan`` (after a load)."""
        for layer in self.layers:
            if isinstance(layer, DecoderLayer):
                layer.self_attn.prepare_products(plan)
                layer.mlp.prepare_products(plan)
        self.head = Product(self.embed_tokens if self.lm_head is None else self.lm_head, None, plan)

    @property
    def packed_bytes(self) -> int:
        """Bytes of the packed copies the plan made (beside the plain weights)."""
        products = [self.head]
        for layer in self.layers:
            if isinstance(layer, DecoderLayer):
                attn, mlp = layer.self_attn, layer.mlp
                products += [attn.qkv, attn.o, mlp.gate_up, mlp.down]
        return sum(p.packed_bytes for p in products)

    def layer(self, index: int) -> DecoderLayer:
        """Decoder layer ``index`` (``nn.ModuleList`` hands out a plain ``Module``)."""
        layer = self.layers[index]
        if not isinstance(layer, DecoderLayer):
            raise TypeError(f"layer {index} is a {type(layer).__name__}, not a DecoderLayer")
        return layer

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: AttentionBackend[MetaT],
        meta: MetaT,
    ) -> torch.Tensor:
        """``attention`` holds every layer's KV pool; ``meta`` is its ``prepare`` of this step."""
        x = F.embedding(input_ids, self.embed_tokens)
        rope = self.rope.tables(positions)  # once per step, not per layer
        for layer in self.layers:
            x = layer(x, rope, attention, meta)
        out: torch.Tensor = self.norm(x)  # nn.Module.__call__ is untyped (returns Any)
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden).float()
