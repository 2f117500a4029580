"""``GET /v1/models``."""

from __future__ import annotations

from fastapi import APIRouter

from control.api.deps import ApiKeyDep, RuntimeDep
from control.api.errors import public_errors
from control.schemas.model_list import ModelCard, ModelList

router = APIRouter(tags=["public"], dependencies=[ApiKeyDep])


@router.get("/v1/models", response_model=ModelList, responses=public_errors(401, 500, 503))
def list_models(runtime: RuntimeDep) -> ModelList:
    card = ModelCard(
        id=runtime.model_name,
        created=runtime.created,
        root=runtime.model_name,
        max_model_len=runtime.service.front.limits.max_model_len,
    )
    return ModelList(data=[card])
