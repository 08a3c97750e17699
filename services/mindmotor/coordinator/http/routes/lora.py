"""vLLM's runtime LoRA endpoints, admin-authenticated (`Authorization: Bearer <admin token>`, the
coordinator's `admin_token`; without one configured they are refused), fanned out to the workers of
the adapter's base model (catalog/adapters.py):

    POST /v1/load_lora_adapter    {"lora_name": "sql", "lora_path": "/adapters/sql", "base_model": "..."}
    POST /v1/unload_lora_adapter  {"lora_name": "sql"}

`base_model` may be left out when the coordinator serves one model. A corrupt or mismatched adapter
is a 400 with the worker's reason, and nothing changes; unloading an unknown adapter is a 404.
Unknown fields are ignored and named in `X-MindMotor-Ignored-Fields`, as on every endpoint
(`http/ignored.py`).
"""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from mindmotor.coordinator.http.errors import APIError, BadRequest, Unauthorized
from mindmotor.coordinator.http.ignored import note_ignored, unknown_fields
from mindmotor.coordinator.http.openapi import API_ERRORS, api_errors
from mindmotor.coordinator.state import Coordinator, CoordinatorDep

router = APIRouter()
ADMIN_PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")


class Forbidden(APIError):
    status = 403
    type = "permission_error"


class LoadLoraAdapter(BaseModel):
    model_config = ConfigDict(extra="allow")     # unknown fields: ignored and named (http/ignored.py)
    lora_name: str = Field(min_length=1, max_length=256, pattern=r"^[^\s/]+$")
    lora_path: str = Field(min_length=1, max_length=4096)
    base_model: str | None = None


class UnloadLoraAdapter(BaseModel):
    model_config = ConfigDict(extra="allow")
    lora_name: str = Field(min_length=1, max_length=256)
    lora_int_id: int | None = None           # vLLM's field, accepted and unused


def check_admin(c: Coordinator, request: Request) -> None:
    token = c.settings.admin_token
    if not token:
        raise Forbidden("loading and unloading LoRA adapters needs the coordinator's admin token (admin_token, "
                        "$MINDMOTOR_ADMIN_TOKEN), which is not configured", code="admin_token_not_configured")
    scheme, _, given = (request.headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise Unauthorized("this endpoint needs the admin token: send 'Authorization: Bearer <admin token>'",
                           code="invalid_admin_token")


ADMIN_ERRORS = api_errors(*API_ERRORS, 403)


@router.post("/v1/load_lora_adapter", responses=ADMIN_ERRORS)
async def load_lora_adapter(body: LoadLoraAdapter, request: Request, c: CoordinatorDep):
    check_admin(c, request)
    note_ignored(request, unknown_fields(body))
    names = c.catalog.names()
    if body.lora_name in names:
        raise BadRequest(f"{body.lora_name!r} is a base model's name", param="lora_name")
    base = body.base_model
    if base is None:
        if len(names) != 1:
            raise BadRequest(f"'base_model' is required: this coordinator serves {', '.join(names) or 'no model'}",
                             param="base_model")
        base = names[0]
    base = c.catalog.resolve(base).name
    loaded = await c.adapters.load(base, body.lora_name, body.lora_path)
    return {"object": "lora_adapter", "lora_name": body.lora_name, "parent": base, "instances": len(loaded)}


@router.post("/v1/unload_lora_adapter", responses=ADMIN_ERRORS)
async def unload_lora_adapter(body: UnloadLoraAdapter, request: Request, c: CoordinatorDep):
    check_admin(c, request)
    note_ignored(request, unknown_fields(body))
    done = await c.adapters.unload(body.lora_name)
    return {"object": "lora_adapter", "lora_name": body.lora_name, "unloaded": True, "instances": len(done)}
