"""The one way the tests start a controller or a worker: a real `mindmotor controller` / `mindmotor
worker` subprocess (`runtime.child_process.ChildProcess`: stdout read on a thread, stderr to a log
file, SIGTERM to it should the test process die), listening on 127.0.0.1 on ports the kernel picks
(`--port 0`; the ready line says which), stopped and reaped by whoever started it.

    ctrl = start_controller(tmp_path / "controller.log", flags=FAST_CONTROLLER)
    (worker,) = start_workers(model_dir, tmp_path, 1, "--timing", "virtual", "--controller", ctrl.address)
    ...
    worker.stop(); ctrl.kill()

The `spawn_controller` and `redis_prefix` fixtures (tests/conftest.py) wrap these for pytest.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import grpc
import httpx

from mindmotor.protocol import worker_pb2 as pb
from mindmotor.protocol import worker_pb2_grpc
from mindmotor.runtime.child_process import ChildProcess, ChildProcessError

START_TIMEOUT_S = 60.0
REDIS_URL = os.environ.get("MINDMOTOR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

# Short timings for controller tests: heartbeat 0.2 s, suspect after 3 misses (0.6 s), dead after
# 1.5 s, leader lease 1 s.
FAST_CONTROLLER = {"--heartbeat-interval": "0.2", "--suspect-misses": "3", "--dead-after": "1.5", "--lease-ttl": "1"}
HEARTBEAT_S, SUSPECT_S, DEAD_S, LEASE_S = 0.2, 0.6, 1.5, 1.0


def flag_args(flags: dict[str, str | None] | None) -> list[str]:
    """{"--flag": "value", "--switch": None} -> ["--flag", "value", "--switch"]."""
    args: list[str] = []
    for flag, value in (flags or {}).items():
        args += [flag] if value is None else [flag, value]
    return args


# ---- controller ---------------------------------------------------------------------------------

class ControllerProcess:
    """`mindmotor controller` on 127.0.0.1: gRPC on `port` (0: the kernel picks), the admin API on a
    port the kernel picks. Only what is given here configures it: $MINDMOTOR_REDIS_URL and
    $MINDMOTOR_ADMIN_TOKEN of the test process are not passed on. Started by the constructor;
    `wait_ready` (or `start_controller`) waits for its ready line."""

    def __init__(self, log_path: Path, *args: str, port: int = 0, admin_token: str | None = None,
                 redis_url: str | None = None, redis_prefix: str | None = None,
                 flags: dict[str, str | None] | None = None):
        """`redis_prefix` alone means the test Redis (`REDIS_URL`) under that prefix; `flags` and
        `args` are added to the command line after everything else."""
        self.log_path = log_path
        self.admin_token = admin_token
        cmd = ["controller", "--host", "127.0.0.1", "--admin-host", "127.0.0.1", "--port", str(port),
               "--admin-port", "0", "--log-level", "DEBUG"]
        if admin_token:
            cmd += ["--admin-token", admin_token]
        if redis_prefix is not None:
            cmd += ["--redis-url", redis_url or REDIS_URL, "--redis-prefix", redis_prefix]
        elif redis_url is not None:
            cmd += ["--redis-url", redis_url]
        self.child = ChildProcess("controller", [*cmd, *flag_args(flags), *args], "MINDMOTOR_CONTROLLER_READY",
                                  log_path, env={"MINDMOTOR_REDIS_URL": None, "MINDMOTOR_ADMIN_TOKEN": None})
        self.proc = self.child.proc
        self.port = self.admin_port = 0

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> "ControllerProcess":
        """Wait for the ready line (ports); the process is killed if it never comes."""
        try:
            ready = self.child.wait_ready(timeout_s)
        except ChildProcessError:
            self.kill()
            raise
        self.port, self.admin_port = int(ready["port"]), int(ready["admin_port"])
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.admin_url + path, headers=self.headers(), timeout=5)

    def post(self, path: str, json: dict | None = None) -> httpx.Response:
        return httpx.post(self.admin_url + path, headers=self.headers(), json=json, timeout=5)

    def instances(self) -> dict[str, dict]:
        response = self.get("/v1/instances")
        response.raise_for_status()
        return {r["instance_id"]: r for r in response.json()["data"]}

    def is_leader(self) -> bool:
        return httpx.get(self.admin_url + "/health", timeout=5).json()["is_leader"]

    @property
    def running(self) -> bool:
        return self.child.alive()

    def kill(self) -> None:
        """SIGKILL (and reap): no cleanup, a leader's lease stays until it expires."""
        self.child.kill()

    stop = kill                      # tests do not wait for shutdowns they do not test

    def terminate(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after `timeout_s`; the exit code."""
        return self.child.stop(timeout_s)


def start_controller(log_path: Path, *args: str, **kwargs) -> ControllerProcess:
    """A `ControllerProcess` (same arguments), once it is ready."""
    return ControllerProcess(log_path, *args, **kwargs).wait_ready()


# ---- worker -------------------------------------------------------------------------------------

class WorkerProcess:
    """`mindmotor worker --model MODEL_DIR` on 127.0.0.1 (gRPC and metrics on ports the kernel picks),
    with a gRPC stub once ready. Started by the constructor; `wait_ready` waits for it (so several
    can start at once: `start_workers`). `stop` kills at once; tests that drain call `terminate`
    and wait themselves."""

    def __init__(self, model_dir: Path, log_path: Path, *extra_args: str, program: list[str] | None = None):
        """`program`: what runs `worker ...` (default: the `mindmotor` command; see faulty_worker.py)."""
        self.log_path = log_path
        self.child = ChildProcess("worker", ["worker", "--model", str(model_dir), "--host", "127.0.0.1",
                                             "--port", "0", "--metrics-port", "0", *extra_args],
                                  "MINDMOTOR_WORKER_READY", log_path, program=program)
        self.proc = self.child.proc
        self.address = ""
        self.channel: grpc.Channel | None = None

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> "WorkerProcess":
        try:
            ready = self.child.wait_ready(timeout_s)
        except ChildProcessError:
            self.stop()
            raise
        self.port, self.metrics_port = int(ready["port"]), int(ready["metrics_port"])
        self.address = f"127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)
        return self

    def status(self) -> pb.StatusResponse:
        return self.stub.Status(pb.StatusRequest(), timeout=5)

    def idle(self) -> bool:
        load = self.status().load
        return load.running == 0 and load.waiting == 0 and load.in_flight == 0

    def log_text(self) -> str:
        return self.log_path.read_text()

    def terminate(self) -> None:
        self.child.signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL now (and reap)."""
        self.child.kill()

    def stop(self) -> None:
        """Kill if still running, always reap, close the channel."""
        self.child.kill()
        if self.channel is not None:
            self.channel.close()


def start_worker(model_dir: Path, log_path: Path, *extra_args: str, program: list[str] | None = None) -> WorkerProcess:
    """A `WorkerProcess` (same arguments), once it is ready."""
    return WorkerProcess(model_dir, log_path, *extra_args, program=program).wait_ready()


def start_workers(model_dir: Path, log_dir: Path, count: int, *extra_args: str,
                  program: list[str] | None = None) -> list[WorkerProcess]:
    """`count` workers started at once, returned when all are ready (all stopped if one fails)."""
    workers = [WorkerProcess(model_dir, log_dir / f"worker-{i}-{time.monotonic_ns()}.log", *extra_args,
                             program=program) for i in range(count)]
    try:
        return [w.wait_ready() for w in workers]
    except BaseException:
        for w in workers:
            w.stop()
        raise
