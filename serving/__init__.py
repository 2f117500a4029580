"""servedeck's step loop and what drives it: ``LLMEngine`` (the step), ``LLM`` (offline use),
``AsyncEngine`` (the server's engine thread), the commands, snapshot, ``n`` > 1 families, loop
health and the test-only faults. It sits above ``policies/``, which sits above ``engine/``.

``from serving import LLM, SamplingParams`` is the user-facing import; inside the tree, import
from the submodules (``from serving.llm import LLM``).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.sampling_params import SamplingParams
    from serving.llm import LLM

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from serving.llm import LLM

        return LLM
    if name == "SamplingParams":
        from engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
