"""HTTP routes, one module per endpoint group; each handler parses, then calls one function."""

from __future__ import annotations

from fastapi import APIRouter

from mindmotor.coordinator.http.routes import (chat, completions, docs, health, invocations, kserve, lora, models,
                                               responses, tokenize)


def api_router() -> APIRouter:
    router = APIRouter()
    for module in (completions, chat, responses, models, tokenize, health, kserve, lora, invocations, docs):
        router.include_router(module.router)
    return router
