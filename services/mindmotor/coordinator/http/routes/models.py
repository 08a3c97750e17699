from __future__ import annotations

from fastapi import APIRouter

from mindmotor.coordinator.http.errors import NotFound
from mindmotor.coordinator.http.openapi import ModelCard, ModelList, api_errors
from mindmotor.coordinator.state import Coordinator, CoordinatorDep

router = APIRouter()


def model_card(c: Coordinator, name: str) -> dict:
    return {"id": name, "object": "model", "created": c.catalog.created, "owned_by": "mindmotor",
            "root": c.catalog.root(name), "parent": None, "max_model_len": c.catalog.max_model_len(name) or None}


def adapter_card(c: Coordinator, name: str, parent: str) -> dict:
    """A LoRA adapter, as vLLM lists one: its own id, `parent` the base model it runs on."""
    return {**model_card(c, parent), "id": name, "root": name, "parent": parent}


def adapters(c: Coordinator) -> dict[str, str]:
    names = set(c.catalog.names())
    served = c.catalog.adapters.adapters() if c.catalog.adapters is not None else {}
    return {name: parent for name, parent in sorted(served.items()) if parent in names and name not in names}


@router.get("/v1/models", responses={200: {"model": ModelList}, **api_errors(401, 429)})
async def list_models(c: CoordinatorDep):
    cards = [model_card(c, name) for name in c.catalog.names()]
    cards += [adapter_card(c, name, parent) for name, parent in adapters(c).items()]
    return {"object": "list", "data": cards}


@router.get("/v1/models/{name:path}", responses={200: {"model": ModelCard}, **api_errors(401, 404, 429)})
async def get_model(name: str, c: CoordinatorDep):
    if name in c.catalog.names():
        return model_card(c, name)
    parent = adapters(c).get(name)
    if parent is None:
        raise NotFound(f"the model {name!r} does not exist", param="model", code="model_not_found")
    return adapter_card(c, name, parent)
