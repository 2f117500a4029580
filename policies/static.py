"""Classic batching, the baseline: up to ``max_batch_size`` requests first-come first-served,
padded to the longest prompt, run until the longest finishes; nobody joins or leaves early."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from engine.sequence import Sequence
from policies.grouped import GroupParams, PaddedGroupPolicy
from policies.json_types import JsonInt


class StaticParams(GroupParams):
    caps: ClassVar[dict[str, str]] = {"max_batch_size": "max_num_seqs"}
    max_batch_size: JsonInt = Field(32, ge=1, le=65536, description="Requests per padded batch.")


class StaticPolicy(PaddedGroupPolicy):
    name = "static"
    params_model = StaticParams

    def _form_groups(self) -> list[list[Sequence]]:
        return [self._take_waiting(self.max_batch_size)]
