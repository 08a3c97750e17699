"""The cluster keeps serving when its leading controller is killed: two controllers on one real
Redis (leader + standby), a real worker and a real coordinator that know both; kill -9 the leader,
the standby takes over, and requests through the coordinator keep working."""

from __future__ import annotations

import httpx

from secrets_registry import given_secret
from service_processes import WorkerProcess

from .conftest import wait_until

TOKEN = given_secret("e2e-failover-admin")


def complete(url: str, model: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "def f(x):", "max_tokens": 4,
                                                     "temperature": 0}, timeout=30)


def test_standby_controller_takes_over_and_serving_continues(spawn_controller, spawn, redis_prefix, e2e_model,
                                                              tmp_path):
    flags = {"--heartbeat-interval": "0.2", "--dead-after": "3", "--lease-ttl": "1"}
    a = spawn_controller("--controller-id", "a", fast=False, extra=flags, admin_token=TOKEN, redis_prefix=redis_prefix)
    wait_until(a.is_leader, what="controller a to lead")
    b = spawn_controller("--controller-id", "b", fast=False, extra=flags, admin_token=TOKEN, redis_prefix=redis_prefix)
    worker = WorkerProcess(e2e_model, tmp_path / "worker.log", "--timing", "virtual", "--worker-id", "w1",
                           "--controller", f"{a.address},{b.address}")
    try:
        worker.wait_ready()
        coordinator = spawn("coordinator", ["coordinator", "--host", "127.0.0.1", "--port", "0",
                                            "--controller", a.address, "--controller", b.address,
                                            "--model", f"{e2e_model.name}={e2e_model}"],
                            "MINDMOTOR_COORDINATOR_READY")
        url = f"http://127.0.0.1:{coordinator.ready['port']}"
        wait_until(lambda: complete(url, e2e_model.name).status_code == 200, what="the first completion")
        assert not b.is_leader()

        a.kill()                                                  # the leader dies without a word
        wait_until(b.is_leader, timeout=15, what="b to take over")   # bound: tests/controller
        wait_until(lambda: b.instances().get("w1", {}).get("state") == "ready", timeout=30, what="w1 ready under b")
        for _ in range(3):
            r = complete(url, e2e_model.name)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 4
    finally:
        worker.stop()
