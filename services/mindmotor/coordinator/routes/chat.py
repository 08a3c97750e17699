from __future__ import annotations

from fastapi import APIRouter, Request

from ..chat import create_chat_completion
from ..schemas import ChatCompletionRequest
from ..state import CoordinatorDep

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, c: CoordinatorDep):
    return await create_chat_completion(c, body, request)
