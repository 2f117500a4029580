"""servedeck's engine: model, paged KV cache and the step loop.

``from engine import LLM, SamplingParams`` is the user-facing import; inside the tree, import
from the submodules so the engine ↔ policies layering cannot become a circular import.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
