"""servedeck's engine: model, paged KV cache, sampler, tenants and outputs (the step loop that
drives them is ``serving/``, a floor above ``policies/``).

``from engine import SamplingParams`` stays a user-facing import (``from serving import LLM,
SamplingParams`` is the usual one); inside the tree, import from the submodules.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.sampling_params import SamplingParams

__all__ = ["SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "SamplingParams":
        from engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
