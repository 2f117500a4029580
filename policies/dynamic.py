"""Dynamic batching (the article's DynamicBatchingScheduler): drain up to twice the batch
size of pending requests, sort them by input length, and cut groups while a request's length
stays within ``length_window`` of the group's shortest and the group is under
``max_batch_size``. Groups are padded and run to completion, one after another."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from engine.sequence import Sequence
from policies.grouped import GroupParams, PaddedGroupPolicy
from policies.json_types import JsonInt


class DynamicParams(GroupParams):
    caps: ClassVar[dict[str, str]] = {"max_batch_size": "max_num_seqs"}
    max_batch_size: JsonInt = Field(32, ge=1, le=65536, description="Most requests in one group.")
    length_window: JsonInt = Field(
        128,
        ge=1,
        le=1 << 20,
        description="A group's inputs differ in length by less than this many tokens.",
    )


class DynamicPolicy(PaddedGroupPolicy):
    name = "dynamic"
    params_model = DynamicParams
    params: DynamicParams

    def _form_groups(self) -> list[list[Sequence]]:
        rank = self.discipline.rank
        drained = sorted(
            self._take_waiting(2 * self.max_batch_size), key=lambda s: (rank(s), s.num_tokens)
        )
        groups: list[list[Sequence]] = []
        for seq in drained:
            current = groups[-1] if groups else None
            if (
                current is None
                or rank(seq) != rank(current[0])
                or seq.num_tokens - current[0].num_tokens >= self.params.length_window
                or len(current) >= self.max_batch_size
            ):
                groups.append([seq])
            else:
                current.append(seq)
        return groups
