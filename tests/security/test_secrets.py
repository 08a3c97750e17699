"""Secrets from the environment and from files, never in a log, an error body or a command line.

A small cluster started the recommended way: a redis-server of our own with a password; a
controller with its admin token and Redis URL in files; a worker; a coordinator with its API keys
and the Redis URL in the environment; a deployer with the admin token in the environment and the
Redis URL in a file. Every secret works where it was given; then Redis dies (and services start
against an unreachable Redis) to force every error path the password used to leak through: the
controller admin API's 503, gRPC error details, the controller's, worker's, deployer's and
coordinator's logs. A search of every log file, body and stderr finds none of the secrets."""

from __future__ import annotations

import subprocess
import sys
import uuid

import grpc
import httpx
import pytest

from mindmotor.common.ports import free_port
from mindmotor.common.waiting import wait_until
from mindmotor.protocol import controller_pb2, controller_pb2_grpc

from .public_side_support import PasswordRedis, Service, clean_env, leaks, token

pytestmark = pytest.mark.timeout(240)


class Cluster:
    pass


@pytest.fixture(scope="module")
def cluster(tiny_ckpt, tmp_path_factory):
    c = Cluster()
    c.logs = tmp_path_factory.mktemp("secrets-logs")
    c.redis = PasswordRedis(c.logs)
    c.admin_token = token("admintok")
    c.keys = [token("sk-secrets-a"), token("sk-secrets-b")]
    c.prefix = f"test-httpsec-{uuid.uuid4().hex[:12]}:"            # not a secret: it is logged
    c.token_file = c.logs / "admin-token"
    c.token_file.write_text(c.admin_token + "\n")
    c.redis_file = c.logs / "redis-url"
    c.redis_file.write_text(c.redis.url + "\n")
    c.bodies: dict[str, str] = {}           # every error body / stderr the tests saw, by where
    c.services: list[Service] = []
    base = clean_env(MINDMOTOR_REDIS_PREFIX=c.prefix)
    try:
        c.controller = Service("controller", [
            "controller", "--port", "0", "--admin-port", "0", "--admin-token-file", str(c.token_file),
            "--redis-url-file", str(c.redis_file), "--heartbeat-interval", "0.5", "--suspect-misses", "2",
            "--dead-after", "3"], "MINDMOTOR_CONTROLLER_READY", c.logs / "controller.log", env=base)
        c.services.append(c.controller)
        c.controller_addr = f"127.0.0.1:{c.controller.ready['port']}"
        c.admin_url = f"http://127.0.0.1:{c.controller.ready['admin_port']}"
        c.worker = Service("worker", [
            "worker", "--model", str(tiny_ckpt), "--port", "0", "--metrics-port", "0", "--timing", "virtual",
            "--controller", c.controller_addr, "--worker-id", "secrets-worker"],
            "MINDMOTOR_WORKER_READY", c.logs / "worker.log", env=base)
        c.services.append(c.worker)
        c.coordinator = Service("coordinator", [
            "coordinator", "--port", "0", "--controller", c.controller_addr, "--rate-limit-rpm", "60000"],
            "MINDMOTOR_COORDINATOR_READY", c.logs / "coordinator.log",
            env={**base, "MINDMOTOR_API_KEYS": ",".join(c.keys), "MINDMOTOR_REDIS_URL": c.redis.url})
        c.services.append(c.coordinator)
        c.url = f"http://127.0.0.1:{c.coordinator.ready['port']}"
        c.deployer = Service("deployer", [
            "deployer", "--port", "0", "--metrics-port", "0", "--controller", c.controller_addr,
            "--redis-url-file", str(c.redis_file)], "MINDMOTOR_DEPLOYER_READY", c.logs / "deployer.log",
            env={**base, "MINDMOTOR_ADMIN_TOKEN": c.admin_token})
        c.services.append(c.deployer)
        c.deployer_addr = f"127.0.0.1:{c.deployer.ready['port']}"
        c.model = tiny_ckpt.name
        yield c
    finally:
        for service in reversed(c.services):
            service.stop()
        c.redis.stop()


def secrets_of(c) -> list[str]:
    return [c.redis.password, c.admin_token, *c.keys]


def deploy_cli(c, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mindmotor.cli", "deploy", "list", "--deployer", c.deployer_addr,
                           *args], capture_output=True, text=True, timeout=60, env=clean_env(**(env or {})))


def test_every_secret_works_where_it_was_given(cluster):
    c = cluster
    with httpx.Client(base_url=c.url, timeout=30) as http:
        wait_until(lambda: http.get("/ready").status_code == 200, timeout=60, what="the worker to be routable")
        for key in c.keys:                                        # the keys from $MINDMOTOR_API_KEYS
            r = http.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                          json={"model": c.model, "prompt": "def f(", "max_tokens": 2})
            assert r.status_code == 200, r.text
        wrong = http.get("/v1/models", headers={"Authorization": "Bearer sk-wrong"})
        assert wrong.status_code == 401
        c.bodies["coordinator 401"] = wrong.text
    import redis                                                   # the rate limit lives in our Redis

    with redis.Redis(port=c.redis.port, password=c.redis.password) as r:
        keys = [k.decode() for k in r.scan_iter(match=c.prefix + "*", count=1000)]
    # $MINDMOTOR_REDIS_PREFIX is every service's prefix: the coordinator's rate-limit buckets are named
    # by the key's digest, the controller's and the deployer's records by what they hold
    assert any(k.startswith(c.prefix + "deployer:") for k in keys), keys
    assert any("instance" in k for k in keys) and len(keys) >= 3, keys

    with httpx.Client(base_url=c.admin_url, timeout=10) as admin:   # the token from --admin-token-file
        listed = admin.get("/v1/instances", headers={"Authorization": f"Bearer {c.admin_token}"})
        assert listed.status_code == 200 and [i["instance_id"] for i in listed.json()["data"]] == ["secrets-worker"]
        refused = admin.get("/v1/instances", headers={"Authorization": "Bearer wrong"})
        assert refused.status_code == 401
        c.bodies["admin 401"] = refused.text

    assert deploy_cli(c, "--admin-token-file", str(c.token_file)).returncode == 0
    assert deploy_cli(c, env={"MINDMOTOR_ADMIN_TOKEN": c.admin_token}).returncode == 0
    refused = deploy_cli(c, env={"MINDMOTOR_ADMIN_TOKEN": "wrong-token"})
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr
    c.bodies["deploy refused"] = refused.stderr


def test_no_secret_on_any_command_line(cluster):
    c = cluster
    for service in c.services:
        cmdline = service.cmdline()
        assert not leaks({service.child.name: cmdline}, secrets_of(c)), cmdline
    assert "MINDMOTOR_API_KEYS" in c.coordinator.environ_names()      # where they are instead


def test_error_paths_and_every_log_hold_no_secret(cluster, tmp_path):
    """Last in this module: it kills the cluster's Redis."""
    c = cluster
    c.redis.stop()
    headers = {"Authorization": f"Bearer {c.admin_token}"}
    with httpx.Client(base_url=c.admin_url, timeout=10, headers=headers) as admin:
        failed = wait_until(lambda: (r := admin.get("/v1/instances")).status_code == 503 and r,
                            timeout=30, what="the admin API's 503")
    c.bodies["admin 503"] = failed.text
    assert failed.json()["error"]["code"] == "store_unavailable"
    assert "redis://:***@127.0.0.1" in failed.text        # the URL is there, its password is not

    with grpc.insecure_channel(c.controller_addr) as channel:
        stub = controller_pb2_grpc.ControllerStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Deregister(controller_pb2.DeregisterRequest(instance_id="nobody"), timeout=10)
    c.bodies["controller gRPC error"] = f"{refused.value.code()}: {refused.value.details()}"

    listed = deploy_cli(c, "--admin-token-file", str(c.token_file))
    c.bodies["deploy with Redis down"] = listed.stdout + listed.stderr

    with httpx.Client(base_url=c.url, timeout=30) as http:           # the rate limit fails open, logged
        r = http.post("/v1/completions", headers={"Authorization": f"Bearer {c.keys[0]}"},
                      json={"model": c.model, "prompt": "x", "max_tokens": 1})
        c.bodies["coordinator with Redis down"] = r.text
    wait_until(lambda: "rate limit store unavailable" in c.coordinator.log_text(), what="the coordinator's warning")
    wait_until(lambda: "redis://:***@" in c.worker.log_text(), timeout=30,
               what="the worker to log the controller's store error")

    # services that start against an unreachable Redis with a password fail, naming it masked
    unreachable = f"redis://:{c.redis.password}@127.0.0.1:{free_port()}/0"
    env = clean_env(MINDMOTOR_REDIS_URL=unreachable, MINDMOTOR_ADMIN_TOKEN=c.admin_token,
                    MINDMOTOR_REDIS_PREFIX=c.prefix)
    for name, args in (("controller", ["controller", "--port", "0", "--admin-port", "0"]),
                       ("deployer", ["deployer", "--port", "0", "--controller", c.controller_addr])):
        out = subprocess.run([sys.executable, "-m", "mindmotor.cli", *args], capture_output=True, text=True,
                             timeout=60, env=env)
        assert out.returncode == 1, out.stderr
        assert "redis://:***@127.0.0.1" in out.stderr
        c.bodies[f"{name} start-up failure"] = out.stdout + out.stderr

    texts = {path.name: path.read_text(errors="replace") for path in c.logs.glob("*.log") if path.name != "redis.log"}
    texts.update(c.bodies)
    assert {"controller.log", "worker.log", "coordinator.log", "deployer.log"} <= set(texts)
    assert "redis://:***@" in texts["controller.log"]
    assert not leaks(texts, secrets_of(c))
