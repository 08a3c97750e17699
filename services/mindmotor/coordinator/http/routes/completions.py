from __future__ import annotations

from fastapi import APIRouter, Request

from mindmotor.coordinator.http.openapi import CompletionResponse, generation
from mindmotor.coordinator.http.ignored import note_ignored, unknown_fields
from mindmotor.coordinator.openai.completions import create_completion
from mindmotor.coordinator.openai.schemas import CompletionRequest
from mindmotor.coordinator.state import CoordinatorDep

router = APIRouter()


@router.post("/v1/completions", responses=generation(CompletionResponse))
async def completions(body: CompletionRequest, request: Request, c: CoordinatorDep):
    note_ignored(request, unknown_fields(body))
    return await create_completion(c, body, request)
