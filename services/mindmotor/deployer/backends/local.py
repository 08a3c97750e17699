"""`LocalBackend`: every replica is a `mindmotor worker` child process of the deployer on this
machine (`launcher.process.ChildProcess`: ready line on stdout, JSON log in a file per replica,
SIGKILL from the kernel when the deployer dies without draining them).

A replica is "starting" until it prints its ready line, then "running". Draining one sends SIGTERM
(the worker stops taking requests, finishes the ones in flight, deregisters, exits) and SIGKILLs it
if it is still there `drain_timeout_s` (+ a grace) later. A replica that exits without being asked
to is "crashed" until the reconcile loop restarts it; `failures` counts crashes in a row that came
within `stable_after_s` of their start, which the loop's backoff grows with.

The processes die with the deployer, so a restarted deployer starts every replica afresh from the
stored specs (it adopts nothing). A deployer that stops drains its replicas first; one that dies
(SIGKILL, a crash) leaves them to the kernel, which SIGKILLs them at once: nobody could restart
them or drain them any more, and a replica left running would register under the same instance id
as the one the restarted deployer starts in its slot (its deregistration on the way out would then
remove the new one). The coordinator moves their in-flight streams to other instances, as for any
worker that dies.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from mindmotor.launcher.process import ChildProcess

from .base import CRASHED, RUNNING, STARTING, STOPPING, Backend, Replica, VersionTarget
from .command import instance_id, worker_args

log = logging.getLogger("mindmotor.deployer")

WORKER_READY = "MINDMOTOR_WORKER_READY"
KILL_GRACE_S = 5.0
CLOSE_POLL_S = 0.05


@dataclass
class _Local:
    replica: Replica
    child: ChildProcess
    stop_deadline: float = 0.0


class LocalBackend(Backend):
    kind = "local"

    def __init__(self, controller: str, log_dir: Path, host: str = "127.0.0.1", drain_timeout_s: float = 30.0,
                 stable_after_s: float = 10.0, clock: Callable[[], float] = time.time):
        self.controller = controller
        self.log_dir = Path(log_dir)
        self.host = host
        self.drain_timeout_s = drain_timeout_s
        self.stable_after_s = stable_after_s
        self.clock = clock
        self._replicas: dict[tuple[str, str, int], _Local] = {}

    async def observe(self) -> list[Replica]:
        now = self.clock()
        for key, local in list(self._replicas.items()):
            self._refresh(key, local, now)
        return [local.replica for local in self._replicas.values()]

    async def scale(self, target: VersionTarget, replicas: int) -> None:
        for slot in range(replicas):
            if (*target.key, slot) not in self._replicas:
                self._spawn(target, slot, failures=0)
        for key, local in self._of(*target.key):
            if key[2] >= replicas:
                self._drain(key, local)

    async def restart(self, replica: Replica, target: VersionTarget) -> None:
        local = self._replicas.get((replica.deployment, replica.version, replica.slot))
        if local is not None and local.replica.phase == CRASHED:
            self._spawn(target, replica.slot, failures=local.replica.failures)

    async def remove(self, deployment: str, version: str) -> None:
        for key, local in self._of(deployment, version):
            self._drain(key, local)

    async def yield_replicas(self) -> None:
        """The new owner cannot see these children and starts its own: drain them all."""
        await self.close()

    async def close(self) -> None:
        """Drain every replica at once; SIGKILL the ones still there after the drain timeout."""
        for key, local in list(self._replicas.items()):
            self._drain(key, local)
        deadline = time.monotonic() + self.drain_timeout_s
        while any(local.child.alive() for local in self._replicas.values()) and time.monotonic() < deadline:
            await asyncio.sleep(CLOSE_POLL_S)
        for local in self._replicas.values():
            local.child.kill()
        self._replicas.clear()

    # ---- one replica ------------------------------------------------------------------------
    def _of(self, deployment: str, version: str) -> list[tuple[tuple[str, str, int], _Local]]:
        return [(k, v) for k, v in self._replicas.items() if k[:2] == (deployment, version)]

    def _spawn(self, target: VersionTarget, slot: int, failures: int) -> None:
        deployment, version = target.key
        worker_id = instance_id(deployment, version, slot)
        args = worker_args(target, target.version.role_of(slot), self.controller, worker_id)
        args += ["--host", self.host, "--port", "0", "--metrics-port", "0"]
        log_path = self.log_dir / f"{worker_id}.log"
        child = ChildProcess(worker_id, args, WORKER_READY, log_path, parent_death_signal=signal.SIGKILL)
        replica = Replica(deployment=deployment, version=version, slot=slot, phase=STARTING, instance_id=worker_id,
                          started_at=self.clock(), failures=failures, log=str(log_path))
        self._replicas[(deployment, version, slot)] = _Local(replica, child)
        log.info("replica started", extra={"deployment": deployment, "version": version, "slot": slot,
                                           "instance_id": worker_id, "pid": child.proc.pid, "log": str(log_path),
                                           "role": target.version.role_of(slot)})

    def _drain(self, key: tuple[str, str, int], local: _Local) -> None:
        if local.replica.phase == CRASHED:
            del self._replicas[key]
        elif local.replica.phase != STOPPING:
            local.child.signal(signal.SIGTERM)
            local.replica = replace(local.replica, phase=STOPPING)
            local.stop_deadline = self.clock() + self.drain_timeout_s + KILL_GRACE_S
            log.info("replica draining", extra={"deployment": key[0], "version": key[1], "slot": key[2],
                                                "pid": local.child.proc.pid})

    def _refresh(self, key: tuple[str, str, int], local: _Local, now: float) -> None:
        replica = local.replica
        if replica.phase == CRASHED:
            return
        if not local.child.alive():
            code = local.child.proc.returncode
            local.child.kill()                                    # reap, close the log
            if replica.phase == STOPPING:
                del self._replicas[key]
                log.info("replica stopped", extra={"deployment": key[0], "version": key[1], "slot": key[2],
                                                   "exit_code": code})
                return
            quick = now - replica.started_at < self.stable_after_s
            local.replica = replace(replica, phase=CRASHED, exited_at=now, exit_code=code,
                                    failures=replica.failures + 1 if quick else 1)
            log.warning("replica exited unexpectedly", extra={
                "deployment": key[0], "version": key[1], "slot": key[2], "exit_code": code,
                "failures": local.replica.failures, "log": replica.log})
        elif replica.phase == STARTING and local.child.poll_ready():
            local.replica = replace(replica, phase=RUNNING)
            log.info("replica serving", extra={"deployment": key[0], "version": key[1], "slot": key[2],
                                               "port": local.child.ready.get("port")})
        elif replica.phase == STOPPING and now > local.stop_deadline:
            log.warning("replica did not drain in time; killing it", extra={
                "deployment": key[0], "version": key[1], "slot": key[2]})
            local.child.signal(signal.SIGKILL)
