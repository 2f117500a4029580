"""``GET /v1/models``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
)


class ModelCard(BaseModel):
    """What vLLM's ``/v1/models`` gives for a model (``permission`` is always empty)."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "servedeck"
    root: str | None = Field(
        None, description="What the model is served as (vLLM: its checkpoint)."
    )
    parent: str | None = None
    max_model_len: int | None = Field(None, description="Prompt + output tokens, at most.")
    permission: list[dict[str, Any]] = Field(default_factory=list)  # OpenAI's, always []


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
