"""A real cluster for the security tests: the cluster CA and certificates (`ensure_cluster_pki`),
a certificate from another CA and an expired one, and the services as real processes on
loopback — controller, one worker (registered as "worker-0-0"), deployer and coordinator — all
with mutual TLS (module `mtls_cluster`) or all with a cluster token (module `token_cluster`).
Every process is killed and reaped at teardown."""

from __future__ import annotations

import datetime
import ssl
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import pytest

from secrets_registry import given_private_key, given_secret
from mindmotor.common import certs, rpc
from mindmotor.common.waiting import wait_until
from mindmotor.protocol import controller_pb2, controller_pb2_grpc, worker_pb2, worker_pb2_grpc
from mindmotor.runtime.child_process import ChildProcess

START_TIMEOUT_S = 90.0
WORKER_ID = "worker-0-0"
SERVICES = {"controller": "controller", WORKER_ID: "worker", "coordinator": "coordinator", "deployer": "deployer",
            "admin": "admin", "other-worker": "worker"}
TOKEN = given_secret("cluster-token-for-tests-0123456789")


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> dict[str, certs.CertPaths]:
    """name → certificate files ("worker": the one of WORKER_ID, the worker's instance id); plus
    "foreign" (another CA's admin), "expired" (ours, expired) and "worker-ca" (the Deployer's)."""
    state = tmp_path_factory.mktemp("state")
    files = certs.ensure_cluster_pki(state, SERVICES)
    files["worker"] = files[WORKER_ID]
    files["worker-ca"] = certs.ensure_worker_ca(state)
    other = tmp_path_factory.mktemp("other-ca")
    certs.init_ca(other)
    files["foreign"] = certs.issue(other, "intruder", "admin")
    now = datetime.datetime.now(datetime.timezone.utc)
    files["expired"] = certs.issue(state / "pki", "expired", "admin", not_before=now - datetime.timedelta(days=30),
                                   not_after=now - datetime.timedelta(days=1))
    for paths in files.values():
        given_private_key(paths.key)
    return files


def tls(paths: certs.CertPaths | None, ca: Path) -> rpc.RpcSecurity:
    """A client's settings: the cluster CA to trust, and `paths`' certificate (None: none)."""
    if paths is None:
        return rpc.RpcSecurity(ca=ca.read_bytes())
    # built from the bytes: RpcSecurity.load refuses expired and foreign certificates, as a service does
    return rpc.RpcSecurity(ca=ca.read_bytes(), cert=paths.cert.read_bytes(), key=paths.key.read_bytes())


@dataclass
class Cluster:
    mode: str
    env: dict[str, dict[str, str]]
    controller: str = ""
    controller_admin: str = ""
    worker: str = ""
    worker_metrics: str = ""
    deployer: str = ""
    deployer_metrics: str = ""
    coordinator_url: str = ""
    children: list[ChildProcess] = field(default_factory=list)
    verify: ssl.SSLContext | bool = True      # for the HTTP side ports: HTTPS with the cluster CA under mTLS
    replica_log_dir: Path | None = None       # the deployer's --log-dir (its replicas' logs and certificates)

    @property
    def side_scheme(self) -> str:
        return "https" if self.mode == "mtls" else "http"

    def start(self, name: str, args: list[str], ready: str, log_dir: Path, who: str) -> dict[str, str]:
        child = ChildProcess(name, args, ready, log_dir / f"{name}.log", env=self.env[who])
        self.children.append(child)
        return child.wait_ready(START_TIMEOUT_S)

    def stop(self) -> None:
        for child in reversed(self.children):
            child.kill()

    def complete(self, prompt: str = "hello") -> dict:
        response = httpx.post(f"{self.coordinator_url}/v1/completions", timeout=30,
                              json={"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0})
        assert response.status_code == 200, response.text
        return response.json()

    def routed_address(self, sec: rpc.RpcSecurity) -> str:
        """The worker-0-0 address in the controller's routing table, read as a coordinator."""
        with rpc.channel(self.controller, sec=sec) as channel:
            call = controller_pb2_grpc.ControllerStub(channel).Watch(controller_pb2.WatchRequest(), timeout=10)
            try:
                table = next(call)
            finally:
                call.cancel()
        return next((i.address for i in table.instances if i.instance_id == WORKER_ID and i.routable), "")

    def worker_status(self, sec: rpc.RpcSecurity) -> worker_pb2.StatusResponse:
        with rpc.channel(self.worker, sec=sec) as channel:
            return worker_pb2_grpc.WorkerStub(channel).Status(worker_pb2.StatusRequest(), timeout=10)


def start_cluster(mode: str, env: dict[str, dict[str, str]], model: Path, log_dir: Path) -> Cluster:
    cluster = Cluster(mode, env)
    if mode == "mtls":
        cluster.verify = ssl.create_default_context(cafile=env["controller"][rpc.ENV_CA])
    try:
        ready = cluster.start("controller", ["controller", "--host", "127.0.0.1", "--port", "0", "--admin-host",
                                             "127.0.0.1", "--admin-port", "0"],
                              "MINDMOTOR_CONTROLLER_READY", log_dir, "controller")
        cluster.controller = f"127.0.0.1:{ready['port']}"
        cluster.controller_admin = f"{cluster.side_scheme}://127.0.0.1:{ready['admin_port']}"
        ready = cluster.start("worker", ["worker", "--model", str(model), "--host", "127.0.0.1", "--port", "0",
                                         "--metrics-port", "0", "--timing", "virtual", "--served-model-name", "tiny",
                                         "--controller", cluster.controller, "--worker-id", WORKER_ID],
                              "MINDMOTOR_WORKER_READY", log_dir, "worker")
        cluster.worker = f"127.0.0.1:{ready['port']}"
        cluster.worker_metrics = f"{cluster.side_scheme}://127.0.0.1:{ready['metrics_port']}/metrics"
        cluster.replica_log_dir = log_dir / "replicas"
        ready = cluster.start("deployer", ["deployer", "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
                                           "--controller", cluster.controller,
                                           "--log-dir", str(cluster.replica_log_dir)],
                              "MINDMOTOR_DEPLOYER_READY", log_dir, "deployer")
        cluster.deployer = f"127.0.0.1:{ready['port']}"
        cluster.deployer_metrics = f"{cluster.side_scheme}://127.0.0.1:{ready['metrics_port']}/metrics"
        ready = cluster.start("coordinator", ["coordinator", "--host", "127.0.0.1", "--port", "0",
                                              "--controller", cluster.controller],
                              "MINDMOTOR_COORDINATOR_READY", log_dir, "coordinator")
        cluster.coordinator_url = f"http://127.0.0.1:{ready['port']}"
        wait_until(lambda: _serves(cluster), timeout=60, interval=0.2, what="a completion through the coordinator")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _serves(cluster: Cluster) -> bool:
    try:
        return httpx.post(f"{cluster.coordinator_url}/v1/completions", timeout=10, json={
            "model": "tiny", "prompt": "hi", "max_tokens": 1}).status_code == 200
    except httpx.HTTPError:
        return False


def metric(url: str, name: str, verify: ssl.SSLContext | bool = True, **labels: str) -> float:
    """The sum of a counter's samples whose labels include `labels`."""
    total = 0.0
    for line in httpx.get(url, timeout=10, verify=verify).text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def code_of(call) -> grpc.StatusCode | None:
    """The status code `call()` fails with (None: it succeeded)."""
    try:
        result = call()
        if hasattr(result, "__next__"):
            list(result)
    except grpc.RpcError as exc:
        return exc.code()
    return None


@pytest.fixture(scope="module")
def mtls_cluster(pki, tiny_ckpt, tmp_path_factory):
    env = {name: pki[name].env() for name in ("controller", "worker", "deployer", "coordinator")}
    env["deployer"].update({"MINDMOTOR_WORKER_CA_CERT": str(pki["worker-ca"].cert),
                            "MINDMOTOR_WORKER_CA_KEY": str(pki["worker-ca"].key)})
    cluster = start_cluster("mtls", env, tiny_ckpt, tmp_path_factory.mktemp("mtls-logs"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def token_cluster(tiny_ckpt, tmp_path_factory):
    token_file = tmp_path_factory.mktemp("token") / "cluster-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    env = {name: {rpc.ENV_TOKEN_FILE: str(token_file)} for name in ("controller", "worker", "deployer", "coordinator")}
    cluster = start_cluster("token", env, tiny_ckpt, tmp_path_factory.mktemp("token-logs"))
    yield cluster
    cluster.stop()
