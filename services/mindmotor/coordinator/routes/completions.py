from __future__ import annotations

from fastapi import APIRouter, Request

from ..completions import create_completion
from ..schemas import CompletionRequest
from ..state import CoordinatorDep

router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, c: CoordinatorDep):
    return await create_completion(c, body, request)
