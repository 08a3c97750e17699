from __future__ import annotations

from fastapi import APIRouter, Request

from mindmotor.coordinator.http.openapi import ChatCompletionResponse, generation
from mindmotor.coordinator.http.ignored import note_ignored, unknown_fields
from mindmotor.coordinator.openai.chat import create_chat_completion
from mindmotor.coordinator.openai.schemas import ChatCompletionRequest
from mindmotor.coordinator.state import CoordinatorDep

router = APIRouter()


@router.post("/v1/chat/completions", responses=generation(ChatCompletionResponse))
async def chat_completions(body: ChatCompletionRequest, request: Request, c: CoordinatorDep):
    note_ignored(request, unknown_fields(body))
    return await create_chat_completion(c, body, request)
