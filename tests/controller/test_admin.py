"""The HTTP admin API of a real controller process: the admin token, the OpenAI error body,
/health, /v1/instances, /metrics."""

from __future__ import annotations

import httpx
import pytest

from secrets_registry import given_secret
from .conftest import eventually

pytestmark = pytest.mark.asyncio
TOKEN = given_secret("s3cret-admin")


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


async def test_admin_token_required(spawn_controller, make_instance):
    ctrl = spawn_controller(admin_token=TOKEN)
    await make_instance(ctrl.address, "a")
    for path in ("/v1/instances", "/v1/instances/a"):
        error = assert_openai_error(httpx.get(ctrl.admin_url + path), 401)
        assert error["code"] == "invalid_api_key"
        assert_openai_error(httpx.get(ctrl.admin_url + path, headers={"Authorization": "Bearer wrong"}), 401)
        assert_openai_error(httpx.get(ctrl.admin_url + path, headers={"Authorization": TOKEN}), 401)
    assert_openai_error(httpx.post(ctrl.admin_url + "/v1/instances/a/drain"), 401)
    assert httpx.get(ctrl.admin_url + "/v1/instances").headers["www-authenticate"] == "Bearer"

    health = httpx.get(ctrl.admin_url + "/health")            # open
    assert health.status_code == 200
    metrics = httpx.get(ctrl.admin_url + "/metrics")          # open: read-only, for Prometheus
    assert metrics.status_code == 200 and "mindmotor_controller_instances" in metrics.text
    assert health.json()["status"] == "ok" and health.json()["is_leader"] is True
    assert health.json()["store"] == "memory"

    listing = ctrl.get("/v1/instances")
    assert listing.status_code == 200
    body = listing.json()
    assert body["object"] == "list" and body["is_leader"] is True and body["version"] >= 1
    [record] = body["data"]
    assert record["instance_id"] == "a" and record["model"] == "tiny" and record["device"] == "910B3"
    assert ctrl.get("/v1/instances/a").json()["instance_id"] == "a"
    assert_openai_error(ctrl.get("/v1/instances/nope"), 404)
    assert_openai_error(httpx.delete(ctrl.admin_url + "/v1/instances/a"), 401)
    assert httpx.delete(ctrl.admin_url + "/v1/instances/a", headers=ctrl.headers()).json()["deleted"] is True
    assert ctrl.get("/v1/instances").json()["data"] == []


async def test_admin_open_without_token(spawn_controller):
    ctrl = spawn_controller()
    assert httpx.get(ctrl.admin_url + "/v1/instances").status_code == 200


async def test_metrics(spawn_controller, make_instance, make_watcher):
    ctrl = spawn_controller(admin_token=TOKEN)
    watcher = await make_watcher(ctrl.address)
    await make_instance(ctrl.address, "a")
    await make_instance(ctrl.address, "b")
    await watcher.wait_for(lambda t: len([i for i in t.instances if i.routable]) == 2, timeout=3)
    await watcher.report_failure("a", "timeout")

    def scrape() -> str | None:
        text = ctrl.get("/metrics").text
        return text if 'mindmotor_controller_instances{state="suspect"} 1.0' in text else None

    text = await eventually(scrape, timeout=3)
    assert 'mindmotor_controller_instances{state="ready"} 1.0' in text
    assert "mindmotor_controller_failures_reported_total 1.0" in text
    assert 'mindmotor_controller_is_leader{controller_id="' in text and '"} 1.0' in text
    assert "mindmotor_controller_routing_table_version" in text
    assert "mindmotor_controller_watchers 1.0" in text
    heartbeats = next(line for line in text.splitlines()
                      if line.startswith("mindmotor_controller_heartbeats_received_total"))
    assert float(heartbeats.split()[-1]) >= 2


async def test_the_admin_api_has_the_http_limits(spawn_controller):
    """The admin port is served with common/http_limits.py: e.g. a request framed two ways (the
    request-smuggling shape) is refused with 400 in the error shape and the connection closed."""
    import json
    import socket
    from urllib.parse import urlsplit

    ctrl = spawn_controller()
    with socket.create_connection(("127.0.0.1", urlsplit(ctrl.admin_url).port), timeout=10) as s:
        s.sendall(b"POST /v1/instances/a/drain HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and json.loads(body)["error"]["code"] == "ambiguous_framing"
