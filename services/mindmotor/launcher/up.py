"""`mindmotor up`: controller, workers and coordinator as child processes of one command.

Start order: controller → workers (registering with it) → coordinator (routing table from the
controller's Watch). Ready when the coordinator serves and its /health sees every worker. Stop
order (Ctrl-C or SIGTERM): coordinator (finishes its streams) → workers (drain) → controller.
A child that dies while the platform runs stops the platform with an error.
"""

from __future__ import annotations

import logging
import signal
import tempfile
import threading
import time
from pathlib import Path

import httpx

from mindmotor.model.checkpoint import resolve_model_dir

from .config import PlatformConfig
from .process import ChildProcess, ChildProcessError

log = logging.getLogger("mindmotor.up")

READY_PREFIX = "MINDMOTOR_UP_READY"


class Platform:
    def __init__(self, config: PlatformConfig):
        self.config = config
        self.log_dir = Path(config.log_dir or tempfile.mkdtemp(prefix="mindmotor-up-"))
        self.controller: ChildProcess | None = None
        self.workers: list[ChildProcess] = []
        self.coordinator: ChildProcess | None = None
        self.url = ""

    # ---- start ----------------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.config
        self.controller = self._spawn("controller", self._controller_args(), "MINDMOTOR_CONTROLLER_READY")
        controller_addr = f"{cfg.host}:{self.controller.ready['port']}"
        model_dirs = {}
        for m, spec in enumerate(cfg.models):
            model_dir = resolve_model_dir(spec.path)
            model_dirs[model_dir.name] = str(model_dir)
            for w in range(spec.workers):
                args = ["worker", "--model", str(model_dir), "--host", cfg.host, "--port", "0",
                        "--metrics-port", "0", "--device", spec.device, "--tp", str(spec.tp),
                        "--timing", spec.timing, "--controller", controller_addr,
                        "--worker-id", f"worker-{m}-{w}", "--role", spec.role_of(w), *spec.extra_args]
                if spec.emulate:
                    args += ["--emulate", spec.emulate]
                if spec.node:
                    args += ["--node", spec.node]
                self.workers.append(self._spawn(f"worker-{m}-{w}", args, "MINDMOTOR_WORKER_READY", wait=False))
        for worker in self.workers:
            worker.wait_ready(cfg.ready_timeout_s)
        args = ["coordinator", "--host", cfg.host, "--port", str(cfg.port), "--controller", controller_addr,
                "--policy", cfg.policy]
        for name, directory in model_dirs.items():
            args += ["--model", f"{name}={directory}"]
        for key in cfg.api_keys:
            args += ["--api-key", key]
        if cfg.rate_limit_rpm:
            args += ["--rate-limit-rpm", str(cfg.rate_limit_rpm)]
        if cfg.redis_url:
            args += ["--redis-url", cfg.redis_url]
        self.coordinator = self._spawn("coordinator", args, "MINDMOTOR_COORDINATOR_READY")
        self.url = f"http://{cfg.host}:{self.coordinator.ready['port']}"
        self._wait_routable(len(self.workers))

    def _controller_args(self) -> list[str]:
        cfg = self.config
        args = ["controller", "--host", cfg.host, "--port", "0", "--admin-host", cfg.host, "--admin-port", "0"]
        if cfg.redis_url:
            args += ["--redis-url", cfg.redis_url, "--redis-prefix", cfg.redis_prefix]
        return args + cfg.controller_args

    def _spawn(self, name: str, args: list[str], ready_prefix: str, wait: bool = True) -> ChildProcess:
        child = ChildProcess(name, args, ready_prefix, self.log_dir / f"{name}.log")
        log.info("starting", extra={"service": name, "log": str(child.log_path)})
        if wait:
            child.wait_ready(self.config.ready_timeout_s)
        return child

    def _wait_routable(self, expected: int) -> None:
        """Until the coordinator's /health reports every worker routable."""
        deadline = time.monotonic() + self.config.ready_timeout_s
        last = None
        while time.monotonic() < deadline:
            try:
                r = httpx.get(f"{self.url}/health", timeout=2)
                last = r.json()
                routable = sum(1 for i in last.get("instances", {}).values() if i.get("routable"))
                if r.status_code == 200 and routable >= expected:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.1)
        raise ChildProcessError(f"the coordinator did not see {expected} healthy workers in time: {last}")

    # ---- run and stop ---------------------------------------------------------------------
    def children(self) -> list[ChildProcess]:
        return [c for c in [self.coordinator, *self.workers, self.controller] if c is not None]

    def watch(self, stop: threading.Event) -> str | None:
        """Block until `stop` is set (returns None) or a child dies (returns its name)."""
        while not stop.wait(0.5):
            for child in self.children():
                if not child.alive():
                    return child.name
        return None

    def stop(self) -> None:
        """Coordinator first, then workers (in parallel, each drains), then the controller."""
        if self.coordinator is not None:
            self.coordinator.stop()
        threads = [threading.Thread(target=w.stop) for w in self.workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.controller is not None:
            self.controller.stop()


def run(config: PlatformConfig) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)   # the readiness polls are not news
    platform = Platform(config)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        platform.start()
    except (ChildProcessError, OSError, ValueError) as exc:
        log.error("the platform did not start", extra={"error": str(exc), "logs": str(platform.log_dir)})
        platform.stop()
        return 1
    announce(platform)
    died = platform.watch(stop)
    if died:
        log.error("a service died; stopping the platform", extra={"service": died, "logs": str(platform.log_dir)})
    print("stopping MindMotor (draining) ...", flush=True)
    platform.stop()
    return 1 if died else 0


def announce(platform: Platform) -> None:
    model = next(iter(platform.config.models))
    name = resolve_model_dir(model.path).name
    auth = ' -H "Authorization: Bearer $KEY"' if platform.config.api_keys else ""
    print(f"""
MindMotor is up: {platform.url}/v1   ({len(platform.workers)} workers; logs in {platform.log_dir})

  curl {platform.url}/v1/completions{auth} -H 'Content-Type: application/json' \\
    -d '{{"model": "{name}", "prompt": "def fibonacci(n):", "max_tokens": 48, "temperature": 0}}'

Ctrl-C drains and stops everything.
{READY_PREFIX} url={platform.url} port={platform.url.rsplit(':', 1)[1]} logs={platform.log_dir}""",
          flush=True)
