"""Deployer test helpers: real processes (controller, deployer, coordinator) started through
`runtime.child_process.ChildProcess` on free ports, the replicas the deployer starts found by their
command line, checkpoints for every verification outcome, a Redis prefix per test.

Everything is stopped at teardown, and the test fails if a replica it started outlives it. Short
timings everywhere: controller heartbeats every 0.2 s, a reconcile pass every 0.2 s, restarts
after 0.2 s (doubling), a 0.5 s owner lease.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import uuid
from pathlib import Path

import pytest

from mindmotor.common.waiting import wait_until
from mindmotor.deployer.client import DeployerClient
from mindmotor.deployer.spec import parse_spec
from mindmotor.model.manifest import build_manifest, write_manifest
from mindmotor.runtime.child_process import ChildProcess
from service_processes import FAST_CONTROLLER, REDIS_URL, ControllerProcess, start_controller

FAST_DEPLOYER = ["--reconcile-interval", "0.2", "--restart-backoff", "0.2", "--restart-backoff-max", "1",
                 "--drain-timeout", "5", "--lease-ttl", "0.5"]
START_S = 30.0


def owned_get(client: DeployerClient, name: str):
    """`Get` once this deployer owns the deployments (a standby answers UNAVAILABLE), else None."""
    import grpc

    try:
        return client.get(name)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        return None


def replica_pids(deployment: str) -> dict[str, int]:
    """worker id -> pid of every live `mindmotor worker` process of the deployment (from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if "worker" in argv and "--deployment" in argv and argv[argv.index("--deployment") + 1] == deployment \
                and "zombie" not in state:
            found[argv[argv.index("--worker-id") + 1]] = int(entry.name)
    return found


class Cluster:
    """One test's processes. `deployment` is a name no other test uses (replicas are found by it)."""

    def __init__(self, tmp_path: Path, model_dir: Path):
        self.tmp_path = tmp_path
        self.model_dir = model_dir
        self.deployment = f"d{uuid.uuid4().hex[:8]}"
        self.model = f"m-{self.deployment}"
        self.children: list[ChildProcess] = []
        self.controller: ControllerProcess | None = None

    # ---- processes --------------------------------------------------------------------------
    def spawn(self, name: str, args: list[str], ready_prefix: str) -> ChildProcess:
        child = ChildProcess(name, args, ready_prefix, self.tmp_path / f"{name}-{len(self.children)}.log")
        self.children.append(child)
        child.wait_ready(START_S)
        return child

    def start_controller(self, admin_token: str | None = None) -> ControllerProcess:
        self.controller = start_controller(self.tmp_path / f"controller-{len(self.children)}.log",
                                           admin_token=admin_token, flags=FAST_CONTROLLER)
        self.children.append(self.controller.child)
        return self.controller

    @property
    def controller_address(self) -> str:
        return self.controller.address

    def start_deployer(self, *extra: str, redis_prefix: str | None = None) -> ChildProcess:
        args = ["deployer", "--host", "127.0.0.1", "--port", "0", "--controller", self.controller_address,
                "--log-dir", str(self.tmp_path / "replicas"), *FAST_DEPLOYER, *extra]
        if redis_prefix is not None:
            args += ["--redis-url", REDIS_URL, "--redis-prefix", redis_prefix]
        return self.spawn("deployer", args, "MINDMOTOR_DEPLOYER_READY")

    def start_coordinator(self, *extra: str) -> ChildProcess:
        return self.spawn("coordinator", ["coordinator", "--host", "127.0.0.1", "--port", "0", "--controller",
                                          self.controller_address, "--model", f"{self.model}={self.model_dir}",
                                          *extra],
                          "MINDMOTOR_COORDINATOR_READY")

    def client(self, deployer: ChildProcess, admin_token: str | None = None) -> DeployerClient:
        return DeployerClient(f"127.0.0.1:{deployer.ready['port']}", admin_token=admin_token, timeout_s=30)

    def stop(self) -> None:
        """Deployers first (they drain their replicas), then everything else; then no replica of
        this test's deployment may be left."""
        for child in self.children:
            if child.name == "deployer" and child.alive():
                child.stop(timeout_s=15)
        for child in self.children:
            child.kill()
        leftovers = self._wait_replicas_gone()
        for pid in leftovers.values():
            os.kill(pid, signal.SIGKILL)
        assert not leftovers, f"replicas outlived the test: {leftovers}"

    def _wait_replicas_gone(self, timeout_s: float = 15.0) -> dict[str, int]:
        deadline = time.monotonic() + timeout_s
        while (pids := replica_pids(self.deployment)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return pids

    # ---- what the controller sees -----------------------------------------------------------
    def instances(self) -> list[dict]:
        return [i for i in self.controller.instances().values() if i["deployment"] == self.deployment]

    def ready_instances(self, version: str | None = None) -> dict[str, dict]:
        return {i["instance_id"]: i for i in self.instances()
                if i["state"] == "ready" and (version is None or i["version"] == version)}

    def wait_ready(self, version: str, count: int, timeout: float = 30.0) -> dict[str, dict]:
        return wait_until(lambda: len(self.ready_instances(version)) == count and self.ready_instances(version),
                          timeout=timeout, what=f"{count} ready instance(s) of {version}")

    def wait_gone(self, version: str, timeout: float = 30.0) -> None:
        wait_until(lambda: not any(i["version"] == version and i["state"] != "dead" for i in self.instances()),
                   timeout=timeout, what=f"every instance of {version} to leave the controller")

    # ---- specs ------------------------------------------------------------------------------
    def spec(self, *versions: dict, traffic: dict | None = None, **fields):
        data = {"name": self.deployment, "model": self.model,
                "versions": [{"checkpoint": str(self.model_dir), "worker": {"timing": "virtual"}, **v}
                             for v in versions], **fields}
        if traffic is not None:
            data["traffic"] = traffic
        return parse_spec(data)


@pytest.fixture
def cluster(tmp_path, tiny_ckpt, monkeypatch):
    """A `Cluster` (nothing started yet); every process stopped at teardown."""
    for name in ("MINDMOTOR_REDIS_URL", "MINDMOTOR_ADMIN_TOKEN", "MINDMOTOR_DEPLOYER"):
        monkeypatch.delenv(name, raising=False)
    c = Cluster(tmp_path, tiny_ckpt)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def manifest_ckpt(tiny_ckpt, tmp_path_factory):
    """The tiny checkpoint with a `mindmotor.json` manifest (verifies)."""
    directory = tmp_path_factory.mktemp("manifest") / "ckpt"
    shutil.copytree(tiny_ckpt, directory)
    write_manifest(directory, build_manifest(directory, version="test-1"))
    return directory


@pytest.fixture(scope="session")
def tampered_ckpt(manifest_ckpt, tmp_path_factory):
    """A checkpoint whose tokenizer_config.json no longer matches its manifest."""
    directory = tmp_path_factory.mktemp("tampered") / "ckpt"
    shutil.copytree(manifest_ckpt, directory)
    with open(directory / "tokenizer_config.json", "a") as f:
        f.write(" ")
    return directory


@pytest.fixture(scope="session")
def unloadable_ckpt(tiny_ckpt, tmp_path_factory):
    """A checkpoint without a manifest whose weights file is garbage: it passes the deployer's
    checks (nothing to verify it against) but no worker can load it."""
    directory = tmp_path_factory.mktemp("unloadable") / "ckpt"
    shutil.copytree(tiny_ckpt, directory)
    (directory / "model.safetensors").write_bytes(b"\0garbage" * 64)
    return directory
