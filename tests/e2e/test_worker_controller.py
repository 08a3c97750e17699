"""A real worker registers with a real controller, heartbeats its load, obeys a drain command,
and deregisters when it stops."""

from __future__ import annotations

import httpx

from secrets_registry import given_secret
from .conftest import wait_until

TOKEN = given_secret("e2e-admin-token")


def instances(admin_port: int) -> list[dict]:
    r = httpx.get(f"http://127.0.0.1:{admin_port}/v1/instances",
                  headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    r.raise_for_status()
    return r.json()["data"]


def test_worker_lifecycle_in_the_controller(spawn, e2e_model):
    controller = spawn("controller", ["controller", "--host", "127.0.0.1", "--port", "0", "--admin-host",
                                      "127.0.0.1", "--admin-port", "0", "--admin-token", TOKEN,
                                      "--heartbeat-interval", "0.2", "--dead-after", "3"],
                       "MINDMOTOR_CONTROLLER_READY")
    admin = int(controller.ready["admin_port"])
    worker = spawn("worker", ["worker", "--model", str(e2e_model), "--host", "127.0.0.1", "--port", "0",
                              "--timing", "virtual", "--worker-id", "w-e2e", "--deployment", "demo",
                              "--version", "v1", "--controller", f"127.0.0.1:{controller.ready['port']}"],
                   "MINDMOTOR_WORKER_READY")

    ready = wait_until(lambda: [i for i in instances(admin) if i.get("state") == "ready"],
                       what="the worker to be ready in the controller")
    (inst,) = ready
    assert inst["instance_id"] == "w-e2e" and inst["address"] == f"127.0.0.1:{worker.ready['port']}"
    assert inst["deployment"] == "demo" and inst["version"] == "v1" and inst["model"]

    r = httpx.post(f"http://127.0.0.1:{admin}/v1/instances/w-e2e/drain", json={"reason": "test"},
                   headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    assert r.status_code == 200
    wait_until(lambda: instances(admin)[0]["state"] == "draining", what="the drain to reach the worker")

    assert worker.stop(timeout_s=30) == 0
    wait_until(lambda: not any(i["instance_id"] == "w-e2e" and i["state"] != "dead" for i in instances(admin)),
               what="the worker to leave the registry")
