"""``GET /v1/models``."""

from __future__ import annotations

from fastapi import APIRouter

from control.api.deps import RuntimeDep
from control.schemas import ModelCard, ModelList

router = APIRouter(tags=["public"])


@router.get("/v1/models", response_model=ModelList)
def list_models(runtime: RuntimeDep) -> ModelList:
    return ModelList(data=[ModelCard(id=runtime.model_name, created=runtime.created)])
