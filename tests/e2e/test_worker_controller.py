"""A real worker registers with a real controller, heartbeats its load, obeys a drain command,
and deregisters when it stops."""

from __future__ import annotations

from secrets_registry import given_secret
from service_processes import WorkerProcess

from .conftest import wait_until

TOKEN = given_secret("e2e-admin-token")


def test_worker_lifecycle_in_the_controller(spawn_controller, e2e_model, tmp_path):
    controller = spawn_controller(fast=False, admin_token=TOKEN, extra={"--heartbeat-interval": "0.2", "--dead-after": "3"})
    worker = WorkerProcess(e2e_model, tmp_path / "worker.log", "--timing", "virtual", "--worker-id", "w-e2e",
                           "--deployment", "demo", "--version", "v1", "--controller", controller.address)
    try:
        worker.wait_ready()
        ready = wait_until(lambda: [i for i in controller.instances().values() if i.get("state") == "ready"],
                           what="the worker to be ready in the controller")
        (inst,) = ready
        assert inst["instance_id"] == "w-e2e" and inst["address"] == worker.address
        assert inst["deployment"] == "demo" and inst["version"] == "v1" and inst["model"]

        assert controller.post("/v1/instances/w-e2e/drain", json={"reason": "test"}).status_code == 200
        wait_until(lambda: controller.instances()["w-e2e"]["state"] == "draining",
                   what="the drain to reach the worker")

        assert worker.child.stop(timeout_s=30) == 0
        wait_until(lambda: not any(i["instance_id"] == "w-e2e" and i["state"] != "dead"
                                   for i in controller.instances().values()),
                   what="the worker to leave the registry")
    finally:
        worker.stop()
