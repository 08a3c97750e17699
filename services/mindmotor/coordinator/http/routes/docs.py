"""`/docs`: Swagger UI over `/openapi.json`, served whole from this process — its script, styles
and icon come from the `swagger-ui-py` package's copy (Swagger UI 5, which reads OpenAPI 3.1),
never from a CDN as FastAPI's default page does, so the page works on a network without the
internet. Like `/openapi.json`, it needs no API key."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.staticfiles import StaticFiles

ASSETS = "/docs/assets"
router = APIRouter()


def assets_dir() -> Path:
    import swagger_ui

    return Path(swagger_ui.__file__).parent / "static"


@router.get("/docs", include_in_schema=False)
async def docs():
    return get_swagger_ui_html(openapi_url="/openapi.json", title="MindMotor Coordinator",
                               swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                               swagger_css_url=f"{ASSETS}/swagger-ui.css",
                               swagger_favicon_url=f"{ASSETS}/favicon-32x32.png")


def mount_assets(app: FastAPI) -> None:
    app.mount(ASSETS, StaticFiles(directory=assets_dir()), name="docs-assets")
