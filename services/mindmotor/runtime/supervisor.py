"""`Supervisor`: keeps services running — `mindmotor up`'s (controller, deployer, coordinator) and
the replicas of `mindmotor coordinator --replicas`. A service that dies is started again with the
same command line (so on the same ports), after a backoff that doubles with each death soon after
its start (backoff.py); every death and restart is logged as a JSON line and counted
(supervisor_metrics.py: `mindmotor_up_restarts_total{service}` on `up`'s /metrics). One death never
stops the others. A service that stays alive but stops answering its liveness probe (liveness.py:
SIGSTOPped, stuck) is SIGKILLed and restarted the same way.

    supervisor = Supervisor(log_dir, backoff, stable_after_s, SupervisorMetrics())
    controller = supervisor.start(Service("controller", args=lambda: [...], ready_prefix=...), timeout_s=60)
    while not stop.wait(0.2):
        supervisor.check()                    # notices deaths, restarts when due, sees restarts ready
    supervisor.stop(["coordinator", "deployer", "controller"])

Processes handed to this one (it is a child subreaper under `up`: a dead deployer's replicas)
are reaped in `check` once they exit; the services' own children are left to `subprocess`.

Children are started from the thread that calls `start` and `check` (the kernel sends them SIGTERM
when that thread ends): call both from the main thread.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .backoff import RestartBackoff
from .child_process import ChildProcess

from mindmotor.vocabulary import ServiceState
from .liveness import LivenessProbe
from .subreaper import reap_orphans
from .supervisor_metrics import SupervisorMetrics

log = logging.getLogger("mindmotor.runtime")

STARTING, RUNNING, WAITING = ServiceState.STARTING, ServiceState.RUNNING, ServiceState.WAITING


@dataclass
class Service:
    name: str
    args: Callable[[], list[str]]           # the command line, asked for at every (re)start
    ready_prefix: str
    env: dict[str, str | None] = field(default_factory=dict)
    stop_timeout_s: float = 30.0
    program: list[str] | None = None        # None: `python -m mindmotor.cli` (tests run other programs)
    on_ready: Callable[["Service"], None] = lambda service: None   # after every restart's ready line
    liveness: LivenessProbe | None = None   # None: only a death is noticed (liveness.py)
    pass_fds: tuple[int, ...] = ()          # open in the child (a listening socket it serves)
    on_death: Callable[["Service", int], None] = lambda service, pid: None   # after a death (its pid)
    child: ChildProcess | None = None
    state: str = STARTING
    started_at: float = 0.0
    died_at: float = 0.0
    failures: int = 0                      # deaths in a row, each soon after its start
    restarts: int = 0

    @property
    def ready(self) -> dict[str, str]:
        return self.child.ready if self.child is not None else {}


class Supervisor:
    def __init__(self, log_dir: Path | None, backoff: RestartBackoff, stable_after_s: float, metrics: SupervisorMetrics,
                 clock: Callable[[], float] = time.monotonic):
        self.log_dir = Path(log_dir) if log_dir is not None else None   # None: children log to our stderr
        self.backoff = backoff
        self.stable_after_s = stable_after_s
        self.metrics = metrics
        self.clock = clock
        self.services: dict[str, Service] = {}

    def start(self, service: Service, timeout_s: float) -> Service:
        """The first start: wait for the ready line (ChildProcessError if it does not come)."""
        return self.start_all([service], timeout_s)[0]

    def start_all(self, services: list[Service], timeout_s: float) -> list[Service]:
        """The first start of several services at once (replicas): all started, then each waited for."""
        for service in services:
            self.services[service.name] = service
            self._spawn(service)
        for service in services:
            service.child.wait_ready(timeout_s)
            self._running(service)
        return services

    def _spawn(self, service: Service) -> None:
        log_path = self.log_dir / f"{service.name}.log" if self.log_dir is not None else None
        service.child = ChildProcess(service.name, service.args(), service.ready_prefix, log_path, env=service.env,
                                     program=service.program, pass_fds=service.pass_fds)
        service.state, service.started_at = STARTING, self.clock()
        log.info("starting", extra={"child": service.name, "pid": service.child.proc.pid,
                                    "log": str(service.child.log_path or "stderr"), "restarts": service.restarts})

    def _running(self, service: Service) -> None:
        service.state = RUNNING
        self.metrics.up.labels(service.name).set(1)
        if service.liveness is not None:
            service.liveness.reset(self.clock())

    def check(self) -> None:
        now = self.clock()
        reap_orphans(keep={s.child.proc.pid for s in self.services.values() if s.child is not None})
        for service in self.services.values():
            if service.state in (STARTING, RUNNING) and not service.child.alive():
                self._died(service, now)
            elif service.state == WAITING and self.backoff.due(service.failures, service.died_at, now):
                service.restarts += 1
                self.metrics.restarts.labels(service.name).inc()
                self._spawn(service)
            elif service.state == RUNNING and service.liveness is not None and service.liveness.poll(now):
                self._unresponsive(service)
            elif service.state == STARTING and service.child.poll_ready():
                self._running(service)
                log.info("service restarted", extra={"child": service.name, "restarts": service.restarts,
                                                      "pid": service.child.proc.pid, **service.ready})
                service.on_ready(service)

    def _unresponsive(self, service: Service) -> None:
        """Alive but not answering (frozen, stuck): SIGKILL it; the next pass restarts it as for
        any death."""
        probe = service.liveness
        self.metrics.liveness_kills.labels(service.name).inc()
        log.error("service does not answer its liveness probe; killing it", extra={
            "child": service.name, "pid": service.child.proc.pid, "probes_failed": probe.misses,
            "url": probe.url(), "timeout_s": probe.settings.timeout_s})
        service.child.signal(signal.SIGKILL)
        service.child.proc.wait()

    def _died(self, service: Service, now: float) -> None:
        code = service.child.proc.returncode
        service.child.kill()                                    # reap it, close its log
        quick = now - service.started_at < self.stable_after_s
        service.failures = service.failures + 1 if quick else 1
        service.state, service.died_at = WAITING, now
        self.metrics.deaths.labels(service.name).inc()
        self.metrics.up.labels(service.name).set(0)
        log.error("service died; restarting it", extra={
            "child": service.name, "exit_code": code, "ran_s": round(now - service.started_at, 3),
            "failures_in_a_row": service.failures, "restarts": service.restarts,
            "restart_in_s": self.backoff.delay(service.failures), "log": str(service.child.log_path or "stderr"),
            "log_tail": service.child.log_tail(5)})
        service.on_death(service, service.child.proc.pid)

    def stop(self, order: list[str | list[str]]) -> None:
        """Stop the services one after the other — a list of names in `order` together (replicas
        drain in parallel) — each SIGKILLed after its stop timeout."""
        for step in order:
            group = [self.services[n] for n in ([step] if isinstance(step, str) else step)
                     if n in self.services and self.services[n].child is not None]
            for service in group:
                service.child.signal(signal.SIGTERM)
            for service in group:
                code = service.child.wait_stopped(service.stop_timeout_s)
                self.metrics.up.labels(service.name).set(0)
                log.info("stopped", extra={"child": service.name, "exit_code": code})

    def kill_all(self) -> None:
        """SIGKILL every child at once (a second stop signal: no drain)."""
        for service in self.services.values():
            if service.child is not None:
                service.child.signal(signal.SIGKILL)
