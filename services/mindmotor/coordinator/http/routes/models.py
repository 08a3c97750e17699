from __future__ import annotations

from fastapi import APIRouter

from mindmotor.coordinator.http.errors import NotFound
from mindmotor.coordinator.http.openapi import ModelCard, ModelList, api_errors
from mindmotor.coordinator.state import Coordinator, CoordinatorDep

router = APIRouter()


def model_card(c: Coordinator, name: str) -> dict:
    return {"id": name, "object": "model", "created": c.catalog.created, "owned_by": "mindmotor",
            "root": c.catalog.root(name), "parent": None, "max_model_len": c.catalog.max_model_len(name) or None}


@router.get("/v1/models", responses={200: {"model": ModelList}, **api_errors(401, 429)})
async def list_models(c: CoordinatorDep):
    return {"object": "list", "data": [model_card(c, name) for name in c.catalog.names()]}


@router.get("/v1/models/{name:path}", responses={200: {"model": ModelCard}, **api_errors(401, 404, 429)})
async def get_model(name: str, c: CoordinatorDep):
    if name not in c.catalog.names():
        raise NotFound(f"the model {name!r} does not exist", param="model", code="model_not_found")
    return model_card(c, name)
