"""The cluster keeps serving when its leading controller is killed: two controllers on one real
Redis (leader + standby), a real worker and a real coordinator that know both; kill -9 the leader,
the standby takes over, and requests through the coordinator keep working."""

from __future__ import annotations

import uuid

import httpx
import redis

from secrets_registry import given_secret
from .conftest import wait_until

TOKEN = given_secret("e2e-failover-admin")


def health(admin_port: int) -> dict:
    return httpx.get(f"http://127.0.0.1:{admin_port}/health", timeout=5).json()


def instance_states(admin_port: int) -> dict:
    r = httpx.get(f"http://127.0.0.1:{admin_port}/v1/instances", headers={"Authorization": f"Bearer {TOKEN}"},
                  timeout=5)
    return {i["instance_id"]: i["state"] for i in r.json()["data"]}


def complete(url: str, model: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "def f(x):", "max_tokens": 4,
                                                     "temperature": 0}, timeout=30)


def test_standby_controller_takes_over_and_serving_continues(spawn, e2e_model):
    prefix = f"mindmotor-e2e:{uuid.uuid4().hex}:"
    common = ["--host", "127.0.0.1", "--port", "0", "--admin-host", "127.0.0.1", "--admin-port", "0",
              "--admin-token", TOKEN, "--redis-url", "redis://127.0.0.1:6379/0", "--redis-prefix", prefix,
              "--heartbeat-interval", "0.2", "--dead-after", "3", "--lease-ttl", "1"]
    try:
        a = spawn("controller-a", ["controller", *common, "--controller-id", "a"], "MINDMOTOR_CONTROLLER_READY")
        wait_until(lambda: health(int(a.ready["admin_port"]))["is_leader"], what="controller a to lead")
        b = spawn("controller-b", ["controller", *common, "--controller-id", "b"], "MINDMOTOR_CONTROLLER_READY")
        controllers = f"127.0.0.1:{a.ready['port']},127.0.0.1:{b.ready['port']}"
        spawn("worker", ["worker", "--model", str(e2e_model), "--host", "127.0.0.1", "--port", "0",
                         "--timing", "virtual", "--worker-id", "w1", "--controller", controllers],
              "MINDMOTOR_WORKER_READY")
        coordinator = spawn("coordinator", ["coordinator", "--host", "127.0.0.1", "--port", "0",
                                            "--controller", f"127.0.0.1:{a.ready['port']}",
                                            "--controller", f"127.0.0.1:{b.ready['port']}",
                                            "--model", f"{e2e_model.name}={e2e_model}"],
                            "MINDMOTOR_COORDINATOR_READY")
        url = f"http://127.0.0.1:{coordinator.ready['port']}"
        wait_until(lambda: complete(url, e2e_model.name).status_code == 200, what="the first completion")
        assert not health(int(b.ready["admin_port"]))["is_leader"]

        a.proc.kill()                                             # the leader dies without a word
        a.proc.wait()
        admin_b = int(b.ready["admin_port"])
        wait_until(lambda: health(admin_b)["is_leader"], timeout=15, what="b to take over")  # bound: tests/controller
        wait_until(lambda: instance_states(admin_b).get("w1") == "ready", timeout=30, what="w1 ready under b")
        for _ in range(3):
            r = complete(url, e2e_model.name)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 4
    finally:
        client = redis.Redis()
        for key in client.scan_iter(prefix + "*"):
            client.delete(key)
