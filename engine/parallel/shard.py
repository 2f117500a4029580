"""Which slice of every split layer a rank holds, and the refusal of a split that cannot be."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from engine.model.config import ModelConfig


@dataclass(frozen=True, slots=True)
class Shard:
    """Rank ``rank`` of ``world_size``: it holds heads and MLP columns ``[rank * n, (rank + 1)
    * n)`` of every split layer (``n = total // world_size``). ``world_size == 1``: the whole
    model, no collective."""

    rank: int = 0
    world_size: int = 1

    @property
    def parallel(self) -> bool:
        return self.world_size > 1

    def part(self, total: int) -> int:
        """This rank's share of ``total`` heads, rows or columns (``check_divisible`` first)."""
        return total // self.world_size

    def narrow(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's slice of a whole checkpoint tensor along ``dim``."""
        size = self.part(tensor.shape[dim])
        return tensor.narrow(dim, self.rank * size, size)


SINGLE = Shard()
"""The whole model on one rank."""


def check_divisible(config: ModelConfig, world_size: int) -> None:
    """``ValueError`` naming the model field that ``tensor_parallel_size`` does not divide:
    every rank must hold whole heads (KV heads included: each rank keeps its own heads' KV
    blocks) and an equal share of the MLP columns."""
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(config, name)
        if value % world_size:
            raise ValueError(
                f"tensor_parallel_size={world_size} must divide the model's {name}={value}"
            )
