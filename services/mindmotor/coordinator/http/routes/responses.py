from __future__ import annotations

from fastapi import APIRouter, Body, Request

from mindmotor.coordinator.openai.responses.create import (create_response, delete_response, get_response,
                                                            input_items_of)
from mindmotor.coordinator.http.openapi import DeletedResponse, ItemList, ResponseObject, api_errors, generation
from mindmotor.coordinator.state import CoordinatorDep

router = APIRouter()


@router.post("/v1/responses", responses=generation(ResponseObject),
             openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                 "schema": {"$ref": "#/components/schemas/ResponsesRequest"}}}}})
async def responses(request: Request, c: CoordinatorDep, body: dict = Body(...)):
    return await create_response(c, body, request)


@router.get("/v1/responses/{response_id}", responses={200: {"model": ResponseObject}, **api_errors(401, 404, 429)})
async def retrieve(response_id: str, c: CoordinatorDep):
    return await get_response(c, response_id)


@router.delete("/v1/responses/{response_id}", responses={200: {"model": DeletedResponse}, **api_errors(401, 404, 429)})
async def delete(response_id: str, c: CoordinatorDep):
    return await delete_response(c, response_id)


@router.get("/v1/responses/{response_id}/input_items", responses={200: {"model": ItemList}, **api_errors(401, 404, 429)})
async def input_items(response_id: str, c: CoordinatorDep):
    return await input_items_of(c, response_id)
