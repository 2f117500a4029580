"""A roofline cost model: a step takes as long as the larger of moving its bytes through HBM and
computing its FLOPs, plus a per-step overhead. The GPU and the model shape are data files
(``sim/profiles/gpus/*.json``, ``sim/profiles/models/*.json``), each constant with its source.

Per step (bf16, ``b`` bytes a parameter, ``kv`` = 2 × layers × KV heads × head_dim × b bytes of
K/V a token):
- bytes = all weights once + K/V read (each decode row its context; each prefill chunk the
  context cached before it) + K/V written (every computed token, padding included);
- FLOPs = 2 × matmul params × tokens computed + 2 × LM-head params × rows sampled (logits are
  computed for the last token of each row only) + attention: 4 × heads × head_dim × layers per
  (query, key) pair, causal inside a prefill chunk;
- time = max(bytes / (bandwidth × memory efficiency), FLOPs / (peak × FLOP efficiency))
  + step overhead + seq overhead × rows.
The KV pool is what a real engine keeps: GPU memory × ``gpu_memory_utilization`` − weights −
activation reserve − runtime reserve, so capacity and preemption are part of the prediction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from engine.config import config_default
from sim.cost_model import CostModel, StepShape

PROFILES = Path(__file__).parent / "profiles"


def _field_values(cls: type, path: Path) -> dict[str, Any]:
    """The dataclass's fields from a JSON file (``*_source`` and other notes are kept there)."""
    data = json.loads(path.read_text())
    return {f.name: data[f.name] for f in fields(cls)}


@dataclass(frozen=True, slots=True)
class GpuProfile:
    name: str
    memory_bytes: float
    hbm_bandwidth_bytes_per_s: float
    memory_efficiency: float
    peak_flops_bf16: float
    flops_efficiency: float
    step_overhead_s: float
    seq_overhead_s: float
    runtime_reserve_bytes: float

    @classmethod
    def load(cls, name_or_path: str | Path) -> GpuProfile:
        return cls(**_field_values(cls, _profile_path("gpus", name_or_path)))

    @property
    def bandwidth(self) -> float:
        """Bytes a second the step's memory traffic moves at."""
        return self.hbm_bandwidth_bytes_per_s * self.memory_efficiency

    @property
    def flop_rate(self) -> float:
        """FLOPs a second the step's compute runs at."""
        return self.peak_flops_bf16 * self.flops_efficiency


@dataclass(frozen=True, slots=True)
class ModelShape:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int
    bytes_per_param: int
    activation_reserve_bytes: float

    @classmethod
    def load(cls, name_or_path: str | Path) -> ModelShape:
        return cls(**_field_values(cls, _profile_path("models", name_or_path)))

    @property
    def layer_params(self) -> int:
        h, q, kv = (
            self.hidden_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        )
        attention = h * q + 2 * h * kv + q * h
        return attention + 3 * h * self.intermediate_size + 2 * h  # + two RMSNorm weights

    @property
    def matmul_params(self) -> int:
        """Params every computed token multiplies through (the decoder layers)."""
        return self.num_layers * self.layer_params

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Decoder + input embedding + untied LM head + final norm (8.03 B for Llama 3 8B)."""
        return self.matmul_params + 2 * self.embedding_params + self.hidden_size

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_param

    @property
    def attention_flops_per_pair(self) -> int:
        """QKᵀ and AV for one query against one key, all heads and layers."""
        return 4 * self.num_heads * self.head_dim * self.num_layers


def _profile_path(kind: str, name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".json":
        return path
    path = PROFILES / kind / f"{name_or_path}.json"
    if not path.exists():
        known = sorted(p.stem for p in (PROFILES / kind).glob("*.json"))
        raise ValueError(f"no {kind[:-1]} profile {name_or_path!r}: one of {', '.join(known)}")
    return path


@dataclass(frozen=True, slots=True)
class StepCost:
    """What a step moves and computes, and the time the roofline gives it."""

    bytes: float
    flops: float
    seconds: float


class RooflineModel(CostModel):
    def __init__(
        self,
        gpu: GpuProfile,
        model: ModelShape,
        gpu_memory_utilization: float = config_default("gpu_memory_utilization"),
    ) -> None:
        self.gpu, self.model = gpu, model
        self.gpu_memory_utilization = gpu_memory_utilization
        self.name = f"{gpu.name}/{model.name}"
        self.max_model_len = model.max_model_len

    def cost(self, shape: StepShape) -> StepCost:
        m, kv = self.model, self.model.kv_bytes_per_token
        tokens = shape.num_tokens
        read = sum(shape.decode_context) + sum(shape.prefill_context)
        nbytes = m.weight_bytes + kv * (read + tokens)
        pairs = sum(shape.decode_context) + sum(
            t * c + t * (t + 1) // 2
            for t, c in zip(shape.prefill_tokens, shape.prefill_context, strict=True)
        )
        flops = (
            2 * m.matmul_params * tokens
            + 2 * m.embedding_params * shape.num_seqs
            + m.attention_flops_per_pair * pairs
        )
        seconds = max(nbytes / self.gpu.bandwidth, flops / self.gpu.flop_rate)
        seconds += self.gpu.step_overhead_s + self.gpu.seq_overhead_s * shape.num_seqs
        return StepCost(nbytes, flops, seconds)

    def step_time(self, shape: StepShape) -> float:
        return self.cost(shape).seconds

    @property
    def kv_pool_bytes(self) -> float:
        budget = self.gpu.memory_bytes * self.gpu_memory_utilization
        return (
            budget
            - self.model.weight_bytes
            - self.model.activation_reserve_bytes
            - (self.gpu.runtime_reserve_bytes)
        )

    def kv_cache_blocks(self, block_size: int) -> int | None:
        blocks = int(self.kv_pool_bytes // (self.model.kv_bytes_per_token * block_size))
        if blocks < 1:
            raise ValueError(f"{self.name}: the weights leave no memory for a KV cache")
        return blocks
