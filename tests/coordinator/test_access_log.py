"""The access log is optional and sampled (`access_log`, `access_log_sample`): every request at
DEBUG, a sample at INFO, every 5xx and every failing probe at INFO; the request counter and the
request id header on every response whatever is logged."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from mindmotor.coordinator.http.auth import APIKeys
from mindmotor.coordinator.http.middleware import FrontDoor
from mindmotor.coordinator.metrics import CoordinatorMetrics


async def ok(request):
    return JSONResponse({"ok": True})


async def broken(request):
    return JSONResponse({"error": "x"}, status_code=503)


def front_door(**options) -> tuple[FrontDoor, CoordinatorMetrics]:
    app = Starlette(routes=[Route("/v1/ok", ok, methods=["GET", "POST"]), Route("/v1/broken", broken),
                            Route("/health", broken)])
    metrics = CoordinatorMetrics()
    return FrontDoor(app, metrics, APIKeys([]), None, 1 << 20, **options), metrics


def run(door, paths: list[str]) -> list[httpx.Response]:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=door), base_url="http://t") as client:
            return [await client.post(p, json={"n": i}) if p == "/v1/ok" else await client.get(p)
                    for i, p in enumerate(paths)]
    return asyncio.run(go())


def access_lines(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.path) for r in caplog.records if r.name == "mindmotor.coordinator.access"]


def test_off_by_default_every_request_at_debug(caplog):
    caplog.set_level(logging.DEBUG, logger="mindmotor.coordinator.access")
    door, metrics = front_door()
    responses = run(door, ["/v1/ok"] * 4)
    assert all(r.status_code == 200 and r.headers["x-request-id"] for r in responses)
    assert access_lines(caplog) == [(logging.DEBUG, "/v1/ok")] * 4
    assert metrics.requests.labels("/v1/ok", "", "200")._value.get() == 4


@pytest.mark.parametrize("sample,expected", [(1.0, 6), (0.5, 3), (0.25, 2)])
def test_a_sample_at_info(caplog, sample, expected):
    caplog.set_level(logging.INFO, logger="mindmotor.coordinator.access")
    door, metrics = front_door(access_log=True, access_log_sample=sample)
    run(door, ["/v1/ok"] * 6)
    assert access_lines(caplog) == [(logging.INFO, "/v1/ok")] * expected
    assert metrics.requests.labels("/v1/ok", "", "200")._value.get() == 6     # counted all the same


def test_5xx_and_failing_probes_always_at_info(caplog):
    caplog.set_level(logging.INFO, logger="mindmotor.coordinator.access")
    door, _ = front_door()                         # access log off
    run(door, ["/v1/ok", "/v1/broken", "/health"])
    assert access_lines(caplog) == [(logging.INFO, "/v1/broken"), (logging.INFO, "/health")]
