"""The deployer as a service and a command: the admin token, the status codes, `mindmotor deploy`
and its exit statuses, SIGTERM. Specs here have no replicas unless a test needs them, so no worker
starts."""

from __future__ import annotations

import json
import subprocess
import sys

import grpc
import pytest
from secrets_registry import given_secret
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mindmotor.common.waiting import wait_until

from .conftest import replica_pids

TOKEN = given_secret("deployer-admin-token")


def deploy(deployer, *args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mindmotor.cli", "deploy", *args, "--deployer", f"127.0.0.1:{deployer.ready['port']}"]
    if token:
        cmd += ["--admin-token", token]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_the_admin_token_is_required_except_for_health(cluster):
    cluster.start_controller()
    deployer = cluster.start_deployer("--admin-token", TOKEN)
    spec = cluster.spec({"name": "v1", "replicas": 0})

    for token in (None, "wrong"):
        with pytest.raises(grpc.RpcError) as refused:
            cluster.client(deployer, admin_token=token).apply(spec)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert cluster.client(deployer, admin_token=TOKEN).apply(spec).spec.name == cluster.deployment

    with grpc.insecure_channel(f"127.0.0.1:{deployer.ready['port']}") as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="mindmotor.v1.Deployer"))
    assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_status_codes(cluster, tmp_path):
    cluster.start_controller()
    client = cluster.client(cluster.start_deployer())
    client.apply(cluster.spec({"name": "v1", "replicas": 0}))

    def code_of(call) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.RpcError) as refused:
            call()
        return refused.value.code(), refused.value.details()

    assert code_of(lambda: client.get("nope"))[0] == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: client.set_traffic(cluster.deployment, {"v9": 1})) == \
        (grpc.StatusCode.INVALID_ARGUMENT, "weights: names unknown versions v9 (versions: v1)")
    code, message = code_of(lambda: client.apply(cluster.spec({"name": "v1", "replicas": 0, "worker": {"timing": "realtime"}})))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "version 'v1' exists with other worker" in message
    assert code_of(lambda: client.promote(cluster.deployment)) == \
        (grpc.StatusCode.FAILED_PRECONDITION, "no rollout in the canary phase to promote (last rollout: none); "
                                              "a rollout is promoted once its replicas are ready")
    code, message = code_of(lambda: client.rollout(cluster.deployment, "v2", canary=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "v1 has none" in message
    code, message = code_of(lambda: client.apply(cluster.spec({"name": "v1", "checkpoint": str(tmp_path / "none")})
                                                 .model_copy(update={"name": "other"})))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "versions[0].checkpoint" in message


def test_the_deploy_command(cluster, tmp_path):
    cluster.start_controller()
    deployer = cluster.start_deployer("--admin-token", TOKEN)
    name = cluster.deployment
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: {name}\nmodel: {cluster.model}\nversions:\n"
                    f"  - {{name: v1, replicas: 0, checkpoint: {cluster.model_dir}}}\n"
                    f"  - {{name: v2, replicas: 0, checkpoint: {cluster.model_dir}}}\n"
                    "traffic: {v1: 3, v2: 1}\n")

    applied = deploy(deployer, "apply", "-f", str(spec))
    assert applied.returncode == 0, applied.stderr
    assert f"{name}  model={cluster.model}  generation=1" in applied.stdout and "75%" in applied.stdout

    shifted = deploy(deployer, "traffic", name, "v1=1", "v2=1", "--json")
    assert shifted.returncode == 0 and json.loads(shifted.stdout)["spec"]["traffic"] == {"v1": 1.0, "v2": 1.0}
    listed = deploy(deployer, "list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)["spec"]["name"] == name

    refused = deploy(deployer, "traffic", name, "v3=1")
    assert refused.returncode == 1 and "INVALID_ARGUMENT: weights: names unknown versions v3" in refused.stderr
    assert deploy(deployer, "traffic", name, "v1:1").returncode == 2

    ab = deploy(deployer, "traffic", name, "v1=1", "v2=3", "--adapter", "sql")    # one adapter's own split
    assert ab.returncode == 0 and "adapter sql: v1 25%, v2 75%" in ab.stdout, ab.stderr
    cleared = deploy(deployer, "traffic", name, "--adapter", "sql", "--json")
    assert cleared.returncode == 0 and not json.loads(cleared.stdout)["spec"].get("adapter_traffic")
    assert deploy(deployer, "rollout", name, "--version", "v3", "--adapter", "sql").returncode == 2
    no_lora = deploy(deployer, "rollout", name, "--version", "v3", "--previous", "v1", "--replicas", "1",
                     "--adapter", f"sql={tmp_path}")
    assert no_lora.returncode == 1 and "FAILED_PRECONDITION" in no_lora.stderr and "enable_lora" in no_lora.stderr
    unauthenticated = deploy(deployer, "get", name, token=None)
    assert unauthenticated.returncode == 1 and "UNAUTHENTICATED" in unauthenticated.stderr

    spec.write_text(f"name: {name}\nmodel: {cluster.model}\nversions:\n  - {{name: v1, replicas: -1, size: 3}}\n")
    invalid = deploy(deployer, "apply", "-f", str(spec))
    assert invalid.returncode == 2
    assert "versions[0].replicas: Input should be greater than or equal to 0 (got -1)" in invalid.stderr
    assert "versions[0].size: unknown field" in invalid.stderr

    deleted = deploy(deployer, "delete", name, "--wait", "20")
    assert deleted.returncode == 0 and "(deleting)" in deleted.stdout
    gone = deploy(deployer, "get", name)
    assert gone.returncode == 1 and "NOT_FOUND" in gone.stderr


def test_sigterm_drains_the_replicas_and_exits(cluster):
    cluster.start_controller()
    deployer = cluster.start_deployer()
    cluster.client(deployer).apply(cluster.spec({"name": "v1", "replicas": 1}))
    cluster.wait_ready("v1", 1)

    assert deployer.stop(timeout_s=20) == 0
    assert replica_pids(cluster.deployment) == {}
    wait_until(lambda: not cluster.instances(), what="the replica to deregister")
    assert '"deployer stopped"' in deployer.log_path.read_text()


def test_deploy_finds_the_running_up_through_its_state_directory_unless_told_otherwise(tmp_path, monkeypatch):
    """No --deployer: the deployer and admin certificate of the `up` whose up.json names a live
    process; explicit TLS files (flags or environment) and an explicit address win; no `up`: the
    default address."""
    import json
    import os

    from mindmotor.cli import build_parser
    from mindmotor.deployer.cli import DEFAULT_DEPLOYER, _find_up
    from mindmotor.runtime.detached_process import proc_start_time

    for name in ("MINDMOTOR_DEPLOYER", "MINDMOTOR_TLS_CA", "MINDMOTOR_TLS_CERT", "MINDMOTOR_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    state = tmp_path / "state"
    state.mkdir()
    tls = {"ca": "/s/pki/ca.pem", "cert": "/s/pki/admin.pem", "key": "/s/pki/admin-key.pem"}
    (state / "up.json").write_text(json.dumps({"pid": os.getpid(), "pid_start": proc_start_time(os.getpid()),
                                               "deployer": "127.0.0.1:41000", "tls": tls}))

    def resolved(*argv):
        args = build_parser().parse_args(["deploy", "list", "--state-dir", str(state), *argv])
        _find_up(args)
        return args.deployer, (args.tls_ca, args.tls_cert, args.tls_key)

    assert resolved() == ("127.0.0.1:41000", (tls["ca"], tls["cert"], tls["key"]))
    assert resolved("--tls-ca", "/mine/ca.pem") == ("127.0.0.1:41000", ("/mine/ca.pem", None, None))
    assert resolved("--deployer", "10.0.0.1:50070") == ("10.0.0.1:50070", (None, None, None))
    monkeypatch.setenv("MINDMOTOR_TLS_CA", "/env/ca.pem")
    assert resolved() == ("127.0.0.1:41000", (None, None, None))      # the environment's files are used
    (state / "up.json").unlink()
    assert resolved() == (DEFAULT_DEPLOYER, (None, None, None))


def test_a_refusal_says_what_its_details_do_not(tmp_path):
    """No `up` found and the default address refused: say so (not a bare 'Connection refused'); the
    `up` found has an admin token: say which variable."""
    import argparse

    import grpc

    from mindmotor.deployer.cli import DEFAULT_DEPLOYER, _hint

    class Refusal(grpc.RpcError):
        def __init__(self, code, details):
            self._code, self._details = code, details

        def code(self):
            return self._code

        def details(self):
            return self._details

    refused = Refusal(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; Connection refused")
    nobody = argparse.Namespace(deployer=DEFAULT_DEPLOYER, state_dir=str(tmp_path), found_up=None)
    assert f"no `mindmotor up` is running on the state directory {tmp_path}" in _hint(nobody, refused)
    assert _hint(argparse.Namespace(deployer="10.0.0.1:1", state_dir=None, found_up=None), refused) == ""
    up = argparse.Namespace(deployer="127.0.0.1:41000", state_dir=None, found_up={"admin_token": True})
    assert "$MINDMOTOR_ADMIN_TOKEN" in _hint(up, Refusal(grpc.StatusCode.UNAUTHENTICATED, "missing admin token"))
