"""`LocalBackend`: every replica is a `mindmotor worker` process on this machine, started so that
it outlives the deployer (a `runtime.detached_process.DetachedProcess`): its parent is the
*anchor* — `mindmotor up` (which passes its pid in `MINDMOTOR_REPLICA_ANCHOR` and reaps what it
adopts), else the deployer itself — and it gets SIGKILL when the anchor dies. Its ready line goes to a file, its JSON
log to another, one pair per replica, in the log directory.

A replica is "starting" until it prints its ready line, then "running". Draining one sends SIGTERM
(the worker stops taking requests, finishes the ones in flight, deregisters, exits) and SIGKILLs it
if it is still there `drain_timeout_s` (+ a grace) later. A replica that exits without being asked
to is "crashed" until the reconcile loop restarts it; `failures` counts crashes in a row that came
within `stable_after_s` of their start, which the loop's backoff grows with.

Adoption: every replica's record — slot, instance id, its process's pid, start time (from
/proc/PID/stat) and a piece of its command line, its ready line's fields (ports) — is kept in
`replicas.json` in the log directory (written on every change, atomically). A deployer that
starts with that directory reads it and adopts each replica whose process is still that very
process (pid + start time + command line), as running (or starting, or stopping) as it was;
anything else is forgotten and its slot started afresh. So under `up` a deployer that dies (SIGKILL,
a crash) costs no worker: its replicas go on serving and the restarted deployer takes them over.
A deployer run on its own is its replicas' anchor: when it dies they die with it (the kernel's
SIGKILL), and when it stops (SIGTERM) it drains them first — no process is left behind either way.
The records are local (processes are local), so this works with an in-memory store too.

Identity: under mutual TLS each replica starts with a certificate of its own,
`mindmotor://worker/<instance id>` (`replica_identity.py`), issued at every (re)start; a running
replica whose certificate would expire within a day is drained — one replica of a version at a
time — and the reconcile loop starts it again with a new one (certificates are read at start).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from mindmotor.common.certs import CertError
from mindmotor.vocabulary import ReplicaPhase
from mindmotor.runtime.detached_process import DetachedProcess, SpawnError
from mindmotor.runtime.subreaper import become_subreaper, reap_orphans

from .base import Backend, Replica, VersionTarget
from .command import instance_id, worker_args
from .replica_identity import ReplicaIdentities
from .worker_env import worker_environment

log = logging.getLogger("mindmotor.deployer")

WORKER_READY = "MINDMOTOR_WORKER_READY"
ANCHOR_ENV = "MINDMOTOR_REPLICA_ANCHOR"      # the pid replicas belong to (set by `mindmotor up`)
STATE_FILE = "replicas.json"
KILL_GRACE_S = 5.0
RENEW_BEFORE_S = 86400.0                    # a replica's certificate: restart it this long before it expires
CLOSE_POLL_S = 0.05

Key = tuple[str, str, int]


@dataclass
class _Local:
    replica: Replica
    process: DetachedProcess
    ready: dict[str, str] = field(default_factory=dict)
    stop_deadline: float = 0.0
    cert_expires: float = 0.0                # unix seconds; 0: no certificate of its own (no mutual TLS)


def replica_anchor() -> int:
    """Whose child a replica is: `mindmotor up` when it says so, else this deployer (made a
    child subreaper so that its replicas' death signal comes from it)."""
    value = os.environ.get(ANCHOR_ENV, "")
    if value.isdigit() and int(value) == os.getppid():
        return int(value)
    become_subreaper()
    return os.getpid()


class LocalBackend(Backend):
    kind = "local"

    def __init__(self, controller: str, log_dir: Path, host: str = "127.0.0.1", drain_timeout_s: float = 30.0,
                 stable_after_s: float = 10.0, clock: Callable[[], float] = time.time, anchor: int | None = None,
                 identities: ReplicaIdentities | None = None):
        self.controller = controller
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.drain_timeout_s = drain_timeout_s
        self.stable_after_s = stable_after_s
        self.clock = clock
        self.anchor = replica_anchor() if anchor is None else anchor
        self.identities = identities or ReplicaIdentities(None, self.log_dir / "certs", [])
        self.adopted = 0                       # replicas taken over from an earlier deployer
        self._replicas: dict[Key, _Local] = {}
        self._saved = ""
        self._adopt()

    async def observe(self) -> list[Replica]:
        now = self.clock()
        for key, local in list(self._replicas.items()):
            self._refresh(key, local, now)
        if self.anchor == os.getpid():
            # a dead replica's own children (its spec helpers) are handed to this subreaper: reap
            # them, never a replica (its exit code is collected above)
            reap_orphans(keep={local.process.pid for local in self._replicas.values()})
        self._renew_certificates(now)
        self._save()
        return [local.replica for local in self._replicas.values()]

    async def scale(self, target: VersionTarget, replicas: int) -> None:
        for slot in range(replicas):
            if (*target.key, slot) not in self._replicas:
                self._spawn(target, slot, failures=0)
        for key, local in self._of(*target.key):
            if key[2] >= replicas:
                self._drain(key, local)
        self._save()

    async def restart(self, replica: Replica, target: VersionTarget) -> None:
        local = self._replicas.get((replica.deployment, replica.version, replica.slot))
        if local is not None and local.replica.phase == ReplicaPhase.CRASHED:
            self._spawn(target, replica.slot, failures=local.replica.failures)
            self._save()

    async def remove(self, deployment: str, version: str) -> None:
        for key, local in self._of(deployment, version):
            self._drain(key, local)
        self._save()

    async def yield_replicas(self) -> None:
        """The new owner cannot see these processes and starts its own: drain them all."""
        await self.close()

    async def close(self) -> None:
        """Drain every replica at once; SIGKILL the ones still there after the drain timeout."""
        for key, local in list(self._replicas.items()):
            self._drain(key, local)
        deadline = time.monotonic() + self.drain_timeout_s
        while any(local.process.alive() for local in self._replicas.values()) and time.monotonic() < deadline:
            await asyncio.sleep(CLOSE_POLL_S)
        for key, local in list(self._replicas.items()):
            local.process.signal(signal.SIGKILL)
            self._forget(key, local)
        self._save()

    # ---- adoption -----------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.log_dir / STATE_FILE

    def _save(self) -> None:
        records = {f"{k[0]}/{k[1]}/{k[2]}": {"replica": asdict(local.replica), "process": local.process.to_dict(),
                                             "ready": local.ready, "cert_expires": local.cert_expires}
                   for k, local in sorted(self._replicas.items()) if local.replica.phase != ReplicaPhase.CRASHED}
        text = json.dumps(records, sort_keys=True, indent=1)
        if text == self._saved:
            return
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.state_path)
        self._saved = text

    def _adopt(self) -> None:
        try:
            records = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return
        now = self.clock()
        for record in records.values() if isinstance(records, dict) else ():
            try:
                replica = Replica(**record["replica"])
            except (KeyError, TypeError):
                continue
            process = DetachedProcess.adopt(record.get("process") or {})
            where = {"deployment": replica.deployment, "version": replica.version, "slot": replica.slot,
                     "instance_id": replica.instance_id}
            if process is None:
                log.info("a recorded replica is gone; its slot starts afresh", extra=where)
                continue
            local = _Local(replica, process, ready=dict(record.get("ready") or {}),
                           cert_expires=float(record.get("cert_expires") or 0.0))
            if replica.phase == ReplicaPhase.STOPPING:
                local.stop_deadline = now + self.drain_timeout_s + KILL_GRACE_S
            self._replicas[(replica.deployment, replica.version, replica.slot)] = local
            self.adopted += 1
            log.info("replica adopted", extra={**where, "pid": process.pid, "phase": replica.phase,
                                               "port": local.ready.get("port")})
        self._save()

    # ---- one replica ------------------------------------------------------------------------
    def _of(self, deployment: str, version: str) -> list[tuple[Key, _Local]]:
        return [(k, v) for k, v in self._replicas.items() if k[:2] == (deployment, version)]

    def _spawn(self, target: VersionTarget, slot: int, failures: int) -> None:
        deployment, version = target.key
        worker_id = instance_id(deployment, version, slot)
        args = worker_args(target, target.version.role_of(slot), self.controller, worker_id)
        args += ["--host", self.host, "--port", "0", "--metrics-port", "0"]
        log_path = self.log_dir / f"{worker_id}.log"
        replica = Replica(deployment=deployment, version=version, slot=slot, phase=ReplicaPhase.STARTING,
                          instance_id=worker_id, started_at=self.clock(), failures=failures, log=str(log_path))
        try:
            tls_env, cert_expires = self.identities.issue(worker_id)
            process = DetachedProcess.spawn([sys.executable, "-m", "mindmotor.cli", *args], log_path,
                                            self.log_dir / f"{worker_id}.out", self.anchor, worker_environment(tls_env),
                                            cmdline_mark=f"--worker-id\0{worker_id}\0")
        except (SpawnError, CertError, OSError) as exc:
            log.error("replica did not start", extra={"deployment": deployment, "version": version, "slot": slot,
                                                      "error": str(exc)})
            replica = replace(replica, phase=ReplicaPhase.CRASHED, exited_at=self.clock(), failures=failures + 1)
            self._replicas[(deployment, version, slot)] = _Local(replica, DetachedProcess(-1, -1, "", "", _gone=True))
            return
        self._replicas[(deployment, version, slot)] = _Local(
            replica, process, cert_expires=cert_expires.timestamp() if cert_expires else 0.0)
        log.info("replica started", extra={"deployment": deployment, "version": version, "slot": slot,
                                           "instance_id": worker_id, "pid": process.pid, "log": str(log_path),
                                           "role": target.version.role_of(slot), "anchor": self.anchor})

    def _renew_certificates(self, now: float) -> None:
        """Drain a running replica whose certificate expires within a day (the reconcile loop
        starts it again with a new one): per version the soonest one, and only while no other
        replica of that version is starting or stopping — renewal never takes out more than one
        replica of a version at a time."""
        for deployment, version in sorted({key[:2] for key in self._replicas}):
            mine = self._of(deployment, version)
            if any(local.replica.phase in (ReplicaPhase.STARTING, ReplicaPhase.STOPPING) for _, local in mine):
                continue
            due = [(key, local) for key, local in mine
                   if local.replica.phase == ReplicaPhase.RUNNING and local.cert_expires
                   and now > local.cert_expires - RENEW_BEFORE_S]
            if due:
                key, local = min(due, key=lambda item: item[1].cert_expires)
                log.info("replica's certificate expires soon; draining it to start it again with a new one", extra={
                    "deployment": deployment, "version": version, "slot": key[2], "cert_expires": local.cert_expires})
                self._drain(key, local)

    def _forget(self, key: Key, local: _Local) -> None:
        del self._replicas[key]
        self.identities.forget(local.replica.instance_id)

    def _drain(self, key: Key, local: _Local) -> None:
        if local.replica.phase == ReplicaPhase.CRASHED:
            self._forget(key, local)
        elif local.replica.phase != ReplicaPhase.STOPPING:
            local.process.signal(signal.SIGTERM)
            local.replica = replace(local.replica, phase=ReplicaPhase.STOPPING)
            local.stop_deadline = self.clock() + self.drain_timeout_s + KILL_GRACE_S
            log.info("replica draining", extra={"deployment": key[0], "version": key[1], "slot": key[2],
                                                "pid": local.process.pid})

    def _refresh(self, key: Key, local: _Local, now: float) -> None:
        replica = local.replica
        if replica.phase == ReplicaPhase.CRASHED:
            return
        if not local.process.alive():
            code = local.process.exit_code
            if replica.phase == ReplicaPhase.STOPPING:
                self._forget(key, local)
                log.info("replica stopped", extra={"deployment": key[0], "version": key[1], "slot": key[2],
                                                   "exit_code": code})
                return
            quick = now - replica.started_at < self.stable_after_s
            local.replica = replace(replica, phase=ReplicaPhase.CRASHED, exited_at=now, exit_code=code,
                                    failures=replica.failures + 1 if quick else 1)
            log.warning("replica exited unexpectedly", extra={
                "deployment": key[0], "version": key[1], "slot": key[2], "exit_code": code,
                "failures": local.replica.failures, "log": replica.log})
        elif replica.phase == ReplicaPhase.STARTING and (ready := local.process.poll_ready(WORKER_READY)) is not None:
            local.ready = ready
            local.replica = replace(replica, phase=ReplicaPhase.RUNNING)
            log.info("replica serving", extra={"deployment": key[0], "version": key[1], "slot": key[2],
                                               "port": ready.get("port")})
        elif replica.phase == ReplicaPhase.STOPPING and now > local.stop_deadline:
            log.warning("replica did not drain in time; killing it", extra={
                "deployment": key[0], "version": key[1], "slot": key[2]})
            local.process.signal(signal.SIGKILL)
