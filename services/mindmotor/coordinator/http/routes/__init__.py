"""HTTP routes, one module per endpoint group; each handler parses, then calls one function."""

from __future__ import annotations

from mindmotor.coordinator.http.routes import (chat, completions, docs, health, invocations, kserve, lora, models,
                                               responses, tokenize)


MODULES = (completions, chat, responses, models, tokenize, health, kserve, lora, invocations, docs)


def api_routes() -> list:
    """Every route of every module, for the app's own router: FastAPI matches an included router's
    routes through a layer per router level, which cost the coordinator ~10 % of its CPU per request
    (issue 26); the routes themselves, listed in the app's router, are matched in one loop."""
    return [route for module in MODULES for route in module.router.routes]
