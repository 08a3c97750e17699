"""`mindmotor up` with `redis_url`: the Deployer keeps its deployments in Redis, so a canary rollout
in progress survives a SIGKILL of the deployer: the replicas of both versions go on running (they
are up's), and the restarted deployer waits out the dead one's lease, then carries on from the
stored record with the replicas it adopted."""

from __future__ import annotations

import uuid

import grpc
import httpx
import pytest
import redis
import yaml

from secrets_registry import given_secret
from mindmotor.deployer.client import DeployerClient
from mindmotor.runtime.child_process import ChildProcess

from .conftest import wait_until
from .test_up_faults import admin_security, kill, service_pids, side_get

REDIS_URL = "redis://127.0.0.1:6379/0"
TOKEN = given_secret("e2e-up-redis-token")


@pytest.fixture
def up_on_redis(e2e_model, tmp_path):
    prefix = f"mindmotor-e2e-up:{uuid.uuid4().hex}:"
    (tmp_path / "up.yaml").write_text(yaml.safe_dump({
        "port": 0, "redis_url": REDIS_URL, "redis_prefix": prefix, "admin_token": TOKEN, "restart_backoff_s": 0.2,
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "logs"), "models": [{"path": str(e2e_model), "name": "canary", "workers": 1,
                                                       "timing": "virtual"}]}))
    up = ChildProcess("up", ["up", "--config", str(tmp_path / "up.yaml")], "MINDMOTOR_UP_READY", tmp_path / "up.log")
    try:
        up.wait_ready(180)
        yield up
    finally:
        assert up.stop(90) == 0
        store = redis.Redis.from_url(REDIS_URL)
        for key in store.scan_iter(f"{prefix}*"):
            store.delete(key)


def get(client: DeployerClient, name: str):
    try:
        return client.get(name)
    except grpc.RpcError:              # the restarted deployer is not up, or stands by
        return None


def routable(url: str) -> set[str]:
    try:
        instances = httpx.get(f"{url}/health", timeout=5).json().get("instances", {})
    except (httpx.HTTPError, ValueError):
        return set()
    return {name for name, i in instances.items() if i.get("routable")}


def addresses(up: ChildProcess) -> dict[str, str]:
    """instance id → address of the ready instances in the controller."""
    try:
        r = side_get(up.ready, "controller_admin_port", "/v1/instances", headers={"Authorization": f"Bearer {TOKEN}"})
        return {i["instance_id"]: i["address"] for i in r.json()["data"] if i["state"] == "ready"}
    except (httpx.HTTPError, ValueError, KeyError):
        return {}


def completes(url: str, model: str) -> bool:
    try:
        return httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 2},
                          timeout=30).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_canary_survives_a_deployer_sigkill(up_on_redis, e2e_model):
    url = up_on_redis.ready["url"]
    admin = admin_security(up_on_redis.ready)           # up's cluster CA: the operator's admin certificate
    with DeployerClient(f"127.0.0.1:{up_on_redis.ready['deployer_port']}", TOKEN, timeout_s=30, sec=admin) as client:
        client.rollout("canary", "v2", checkpoint=str(e2e_model), canary=50)
        assert client.wait_rollout("canary", timeout_s=120).rollout.phase == "canary"
        wait_until(lambda: routable(url) == {"canary-v1-0", "canary-v2-0"}, timeout=30, interval=0.2,
                   what="both versions routable")
        workers = service_pids(up_on_redis, "worker")
        before = addresses(up_on_redis)
        assert set(before) == {"canary-v1-0", "canary-v2-0"}

        (deployer,) = service_pids(up_on_redis, "deployer")
        kill(deployer)
        recovered = wait_until(lambda: get(client, "canary"), timeout=30, interval=0.2,
                               what="the restarted deployer to own the deployments")
        assert recovered.rollout.phase == "canary" and [v.name for v in recovered.spec.versions] == ["v1", "v2"]
        wait_until(lambda: [(v.running, v.restarts) for v in get(client, "canary").versions] == [(1, 0), (1, 0)],
                   timeout=30, interval=0.2, what="both versions' replicas adopted")
        assert service_pids(up_on_redis, "worker") == workers          # the same processes, never replaced
        assert addresses(up_on_redis) == before
    wait_until(lambda: completes(url, e2e_model.name), timeout=30, interval=0.2, what="the platform serving again")
    assert up_on_redis.alive()


def test_a_redis_back_empty_replaces_no_worker(e2e_model, tmp_path):
    """A private Redis killed and started empty under `up`: the deployer sees its store's epoch
    change, keeps the running replicas until `up` applies the deployment again and takes them over:
    the same worker processes serve before and after, none restarted (counted as a store reset)."""
    from mindmotor.common.redis_testing import RedisServer

    with RedisServer() as server:
        (tmp_path / "up.yaml").write_text(yaml.safe_dump({
            "port": 0, "redis_url": server.url, "admin_token": TOKEN, "restart_backoff_s": 0.2,
            "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "logs"), "models": [{"path": str(e2e_model), "name": "empty", "workers": 2,
                                                           "timing": "virtual"}]}))
        up = ChildProcess("up", ["up", "--config", str(tmp_path / "up.yaml")], "MINDMOTOR_UP_READY",
                          tmp_path / "up.log")
        try:
            up.wait_ready(180)
            url = up.ready["url"]
            workers = service_pids(up, "worker")
            assert len(workers) == 2 and completes(url, e2e_model.name)

            server.restart()                                    # every key is gone
            def deployer_saw_it() -> bool:
                try:
                    return "mindmotor_deployer_store_resets_total 1.0" in \
                        side_get(up.ready, "deployer_metrics_port", "/metrics").text
                except httpx.HTTPError:
                    return False
            wait_until(deployer_saw_it, timeout=30, interval=0.2, what="the deployer to see the store reset")
            with DeployerClient(f"127.0.0.1:{up.ready['deployer_port']}", TOKEN, timeout_s=10,
                                sec=admin_security(up.ready)) as client:
                wait_until(lambda: (d := get(client, "empty")) is not None and
                           [(v.running, v.restarts) for v in d.versions] == [(2, 0)], timeout=30, interval=0.2,
                           what="up to apply the deployment again and the deployer to run the same two replicas")
            wait_until(lambda: completes(url, e2e_model.name), timeout=30, interval=0.2, what="the platform serving")
            assert service_pids(up, "worker") == workers          # nothing drained, nothing replaced
            assert up.alive()
        finally:
            assert up.stop(90) == 0
