"""Where services listen by default, and what an admin endpoint beyond loopback demands: every
`--*host` option of every `mindmotor` command defaults to 127.0.0.1; the controller admin API, the
Deployer and the Trainer refuse to start beyond loopback without a token (a clear error, no ready
line), start with one (and then demand it), and start open only when told `--allow-open-admin`."""

from __future__ import annotations

import argparse
import subprocess
import sys

import httpx
import pytest

from mindmotor.common.exposure import is_loopback, open_api_warning

from .public_side_support import Service, clean_env, token

pytestmark = pytest.mark.timeout(180)

LOOPBACK = "127.0.0.1"


def host_options() -> list[tuple[str, argparse.Action]]:
    """("mindmotor <command ...>", action) for every option named --host or --*-host, in every (sub)command."""
    from mindmotor.cli import build_parser

    found = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif any(o == "--host" or o.endswith("-host") for o in action.option_strings):
                found.append((path, action))

    walk(build_parser(), "mindmotor")
    return found


def test_every_host_option_defaults_to_loopback():
    options = host_options()
    commands = {path for path, _ in options}
    assert {"mindmotor controller", "mindmotor worker", "mindmotor deployer", "mindmotor trainer",
            "mindmotor coordinator"} <= commands, commands
    for path, action in options:
        setting = getattr(action, "setting", None)     # a flag of a service's settings (common/settings_flags.py)
        if setting is not None:
            assert setting.default() == LOOPBACK, (path, action.option_strings, setting.default())
            continue
        if action.default is None:        # resolved later: the coordinator's settings, `up`'s config file;
            # `certs issue --host` names a certificate's hosts, it binds nothing
            assert path in ("mindmotor coordinator", "mindmotor up", "mindmotor certs issue"), \
                (path, action.option_strings)
            continue
        assert action.default == LOOPBACK, (path, action.option_strings, action.default)


def test_the_coordinator_default_resolved_by_its_settings_is_loopback_too():
    from mindmotor.coordinator.config import load_settings

    assert load_settings(None, workers=["127.0.0.1:1"]).host == LOOPBACK


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("", False), ("10.0.0.5", False), ("controller.example", False)])
def test_what_counts_as_loopback(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("host, keys, warned", [
    ("0.0.0.0", False, True), ("10.0.0.5", False, True), ("0.0.0.0", True, False), ("127.0.0.1", False, False)])
def test_an_api_without_keys_beyond_loopback_is_warned_of(host, keys, warned):
    warning = open_api_warning(host, keys)
    assert (warning is not None) is warned
    if warned:
        assert host in warning and "MINDMOTOR_API_KEYS" in warning


@pytest.mark.parametrize("keys", [False, True], ids=["open", "with-keys"])
def test_a_coordinator_serving_beyond_loopback_says_whether_its_api_is_open(tmp_path, keys):
    api_key = token("sk-bind")
    env = clean_env(MINDMOTOR_API_KEYS=api_key) if keys else clean_env()
    coordinator = Service("coordinator", ["coordinator", "--host", "0.0.0.0", "--port", "0", "--worker", "127.0.0.1:1"],
                          "MINDMOTOR_COORDINATOR_READY", tmp_path / "coordinator.log", env=env)
    coordinator.stop()
    log = coordinator.log_text()
    assert ("without API keys" in log) is not keys, log
    assert api_key not in log


def run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mindmotor.cli", *args], capture_output=True, text=True,
                          timeout=60, env=clean_env(**env))


@pytest.mark.parametrize("args, code", [
    (["controller", "--port", "0", "--admin-port", "0", "--admin-host", "0.0.0.0"], 1),
    (["deployer", "--port", "0", "--host", "0.0.0.0", "--controller", "127.0.0.1:1"], 1),
    (["trainer", "--port", "0", "--host", "0.0.0.0"], 2),
], ids=["controller", "deployer", "trainer"])
def test_an_admin_endpoint_beyond_loopback_without_a_token_refuses_to_start(args, code):
    out = run(args)
    assert out.returncode == code, out.stderr
    assert "READY" not in out.stdout
    assert "beyond loopback) without an admin token" in out.stderr and "MINDMOTOR_ADMIN_TOKEN" in out.stderr
    assert "--allow-open-admin" in out.stderr


def test_beyond_loopback_with_a_token_it_starts_and_demands_it(tmp_path):
    admin_token = token("admintok")
    controller = Service("controller", ["controller", "--port", "0", "--admin-port", "0", "--admin-host", "0.0.0.0"],
                         "MINDMOTOR_CONTROLLER_READY", tmp_path / "controller.log",
                         env=clean_env(MINDMOTOR_ADMIN_TOKEN=admin_token))
    try:
        url = f"http://127.0.0.1:{controller.ready['admin_port']}/v1/instances"
        assert httpx.get(url, timeout=10).status_code == 401
        assert httpx.get(url, timeout=10, headers={"Authorization": f"Bearer {admin_token}"}).status_code == 200
    finally:
        controller.stop()
    assert admin_token not in controller.log_text()


def test_allow_open_admin_starts_it_open_on_purpose(tmp_path):
    controller = Service("controller", ["controller", "--port", "0", "--admin-port", "0", "--admin-host", "0.0.0.0",
                                        "--allow-open-admin"], "MINDMOTOR_CONTROLLER_READY",
                         tmp_path / "controller.log", env=clean_env())
    try:
        url = f"http://127.0.0.1:{controller.ready['admin_port']}/v1/instances"
        assert httpx.get(url, timeout=10).status_code == 200
    finally:
        controller.stop()
    assert "the admin API is open" in controller.log_text()


def test_the_trainer_demands_its_admin_token_on_every_call_but_health(tmp_path):
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from mindmotor.common.admin_token import bearer_metadata
    from mindmotor.common.waiting import wait_until
    from mindmotor.protocol import trainer_pb2, trainer_pb2_grpc

    from mindmotor.common.ports import free_port

    admin_token, port = token("admintok"), free_port()
    token_file = tmp_path / "token"
    token_file.write_text(admin_token)
    with open(tmp_path / "trainer.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mindmotor.cli", "trainer", "--host", "0.0.0.0", "--port",
                                 str(port), "--store", str(tmp_path / "store"), "--admin-token-file", str(token_file)],
                                stdout=subprocess.DEVNULL, stderr=log, env=clean_env())
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)

            def serving():
                assert proc.poll() is None, (tmp_path / "trainer.log").read_text()
                try:
                    return health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == \
                        health_pb2.HealthCheckResponse.SERVING
                except grpc.RpcError:
                    return False

            wait_until(serving, timeout=60, what="the trainer to serve")
            stub = trainer_pb2_grpc.TrainerStub(channel)
            for metadata in ((), bearer_metadata("wrong")):
                with pytest.raises(grpc.RpcError) as refused:
                    stub.ListJobs(trainer_pb2.ListJobsRequest(), metadata=metadata, timeout=10)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            stub.ListJobs(trainer_pb2.ListJobsRequest(), metadata=bearer_metadata(admin_token), timeout=10)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert admin_token not in (tmp_path / "trainer.log").read_text()
