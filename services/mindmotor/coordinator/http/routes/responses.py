from __future__ import annotations

from fastapi import APIRouter, Body, Request

from mindmotor.coordinator.openai.responses.create import (create_response, delete_response, get_response,
                                                            input_items_of)
from mindmotor.coordinator.state import CoordinatorDep

router = APIRouter()


@router.post("/v1/responses")
async def responses(request: Request, c: CoordinatorDep, body: dict = Body(...)):
    return await create_response(c, body, request)


@router.get("/v1/responses/{response_id}")
async def retrieve(response_id: str, c: CoordinatorDep):
    return await get_response(c, response_id)


@router.delete("/v1/responses/{response_id}")
async def delete(response_id: str, c: CoordinatorDep):
    return await delete_response(c, response_id)


@router.get("/v1/responses/{response_id}/input_items")
async def input_items(response_id: str, c: CoordinatorDep):
    return await input_items_of(c, response_id)
