"""`Reconciler`: the loop that makes what runs match what the store says should run.

Every pass (each `interval_s`, and at once after `poke()` — an API change, a new routing table;
only while this deployer holds the owner lease, when several share one store):

1. read every `DeploymentRecord` from the store and every replica from the backend;
2. move a rollout on: all new replicas ready in the controller → canary traffic; its deadline
   passed → failed and rolled back, with the reason (written to the store before anything else);
   a canary whose analysis (`analysis.py`, on the coordinators' per-version figures read each
   pass: `coordinator_metrics.py`) finds it worse than the previous version → failed and rolled
   back, the figures in the reason;
3. push the deployment's traffic weights to the controller when the routing table shows others;
4. per version: `scale` when the replica slots differ from the desired count (start missing ones,
   drain surplus ones), `restart` crashed replicas whose backoff has passed; `remove` versions
   that left the spec; replicas of deployments no record names are removed too;
5. forget a deleted deployment once nothing of it runs and its traffic entry is gone;
6. publish the status (per version: desired, running, ready, restarts, weight) and the metrics.

A store that lost its data (a Redis restarted empty or flushed: its epoch changed,
common/store_epoch.py; or a deployer that adopted running replicas finding a store with no epoch
at all) holds no deployment records, yet every replica still runs: then replicas that no record
names are kept, not removed, for `orphan_grace_s` — time for the specs to be applied again (`up`
does within 2 s) — and removed only if they are still orphans after it. Counted in
`mindmotor_deployer_store_resets_total`; the replicas so kept in `mindmotor_deployer_kept_orphans`.

Idempotent: a pass that finds everything as it should be does nothing. Every action is logged with
its deployment and version and counted in `mindmotor_deployer_reconcile_actions_total`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from mindmotor.common.store import StoreUnavailable
from mindmotor.common.store_epoch import store_epoch
from mindmotor.vocabulary import ReplicaPhase, RolloutPhase
from mindmotor.runtime.backoff import RestartBackoff

from . import rollout
from .analysis import AnalysisSettings, judge
from .backends.base import Backend, Replica, VersionTarget
from .controller_link import ControllerLink, TrafficRefused
from .coordinator_metrics import CoordinatorFigures
from .metrics import DeployerMetrics
from .records import DeploymentRecord
from .store import REMOVE, DeploymentStore

log = logging.getLogger("mindmotor.deployer")

REPUSH_S = 2.0          # weights the table does not show yet are pushed again after this
ORPHAN_GRACE_S = 30.0   # after a store reset: how long replicas no record names are kept


@dataclass(frozen=True)
class VersionStatus:
    version: str
    desired: int
    running: int
    ready: int
    restarts: int
    weight: float
    last_failure: str


class Reconciler:
    def __init__(self, deployments: DeploymentStore, backend: Backend, controller: ControllerLink,
                 metrics: DeployerMetrics, interval_s: float = 1.0, backoff: RestartBackoff = RestartBackoff(),
                 clock: Callable[[], float] = time.time, active: Callable[[], bool] = lambda: True,
                 coordinator_figures: CoordinatorFigures | None = None, orphan_grace_s: float = ORPHAN_GRACE_S):
        self.deployments = deployments
        self.orphan_grace_s = orphan_grace_s
        self._epoch: str | None = None
        self.orphans_kept_until = 0.0                        # after a store reset: orphans kept till then
        self.active = active              # False: a standby deployer (another one holds the owner lease)
        self.backend = backend
        self.controller = controller
        self.metrics = metrics
        self.interval_s = interval_s
        self.backoff = backoff
        self.clock = clock
        self.status: dict[str, list[VersionStatus]] = {}     # deployment -> versions, as last seen
        self.coordinator_figures = coordinator_figures
        self.figures: dict[str, str] = {}                    # deployment -> its canary's last analysis
        self.passes = 0
        self._restarts: Counter[tuple[str, str]] = Counter()
        self._last_failure: dict[tuple[str, str], str] = {}
        # (name, adapter) -> (model, weights, when)
        self._pushed: dict[tuple[str, str], tuple[str, dict[str, float], float]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    # ---- the loop ---------------------------------------------------------------------------
    def poke(self) -> None:
        """Something changed: run a pass soon."""
        self._wake.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="deployer-reconcile")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                if self.active():
                    with self.metrics.passes.time():
                        await self.reconcile_once()
            except StoreUnavailable as exc:
                self.metrics.errors.labels("store").inc()
                log.warning("reconcile pass skipped: store unreachable", extra={"error": str(exc)})
            except Exception:  # noqa: BLE001 — one bad pass must not end the loop
                self.metrics.errors.labels("error").inc()
                log.exception("reconcile pass failed")
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.interval_s)
            except asyncio.TimeoutError:
                pass

    async def reconcile_once(self) -> None:
        epoch, created = await store_epoch(self.deployments.store)
        records = await self.deployments.list()
        replicas = await self.backend.observe()
        now = self.clock()
        self._watch_epoch(epoch, created, replicas, now)
        if any(self._analysed(r) for r in records):
            await self.coordinator_figures.sample()
        for record in records:
            record = await self._advance_rollout(record, replicas, now)
            if record is not None and self._analysed(record):
                record = await self._analyse(record, now)
            if record is None:
                continue
            await self._sync_traffic(record, now)
            await self._converge(record, replicas, now)
        await self._remove_orphans({r.name for r in records}, replicas)
        await self._forget_deleted(records, replicas)
        self._publish(records, replicas)
        self.passes += 1

    # ---- 2. rollouts ------------------------------------------------------------------------
    async def _advance_rollout(self, record: DeploymentRecord, replicas: list[Replica],
                               now: float) -> DeploymentRecord | None:
        state = record.rollout
        if state is None or state.phase != RolloutPhase.STARTING or record.deleting:
            return record
        version = record.spec.version(state.version)
        wanted = version.replicas if version else 0
        ready = self.controller.ready(record.name, state.version)
        if ready >= wanted:
            action, change = "rollout_ready", lambda r: rollout.ready(r, now)
        elif now > state.deadline:
            reason = self._not_ready_reason(record.name, state.version, ready, wanted, replicas, now - state.started_at)
            action, change = "rollout_failed", lambda r: rollout.roll_back(r, reason, now, failed=True)
        else:
            return record

        def apply(current: DeploymentRecord):
            same = current.rollout is not None and current.rollout.phase == RolloutPhase.STARTING \
                and current.rollout.version == state.version
            if same:
                change(current)

        updated = await self.deployments.update(record.name, apply)
        if updated is not None and updated.rollout is not None and updated.rollout.phase != RolloutPhase.STARTING:
            self._count(record.name, state.version, action)
            log_fn = log.warning if action == "rollout_failed" else log.info
            log_fn(f"rollout {updated.rollout.phase}", extra={
                "deployment": record.name, "version": state.version, "previous": state.previous,
                "reason": updated.rollout.reason, "traffic": updated.spec.traffic})
        return updated

    def _analysed(self, record: DeploymentRecord) -> bool:
        state = record.rollout
        return (state is not None and state.phase == RolloutPhase.CANARY and bool(state.analysis)
                and not record.deleting and self.coordinator_figures is not None and self.coordinator_figures.enabled)

    async def _analyse(self, record: DeploymentRecord, now: float) -> DeploymentRecord | None:
        """Judge the canary on the coordinators' figures; roll it back if it failed."""
        state = record.rollout
        settings = AnalysisSettings.from_dict(state.analysis)
        judged = state.adapter or record.spec.model           # an adapter rollout: that adapter's requests
        figures, covered = self.coordinator_figures.window(judged, [state.version, state.previous],
                                                           since=state.canary_at, window_s=settings.window_s)
        verdict = judge(settings, state.version, figures[state.version], state.previous, figures[state.previous],
                        covered)
        self.figures[record.name] = verdict.summary
        if not verdict.failed:
            return record
        reason = f"canary analysis: {verdict.summary}; rolled back"

        def apply(current: DeploymentRecord):
            if current.rollout is not None and current.rollout.phase == RolloutPhase.CANARY \
                    and current.rollout.version == state.version:
                rollout.roll_back(current, reason, now, failed=True)

        updated = await self.deployments.update(record.name, apply)
        if updated is not None and updated.rollout is not None and updated.rollout.phase != RolloutPhase.CANARY:
            self.figures.pop(record.name, None)
            self._count(record.name, state.version, "rollout_analysis_failed")
            log.warning("rollout failed its canary analysis; rolled back", extra={
                "deployment": record.name, "version": state.version, "previous": state.previous,
                "reason": reason, "traffic": updated.spec.traffic})
        return updated

    def _not_ready_reason(self, deployment: str, version: str, ready: int, wanted: int,
                          replicas: list[Replica], waited_s: float) -> str:
        reason = f"{ready} of {wanted} replica(s) of {version} ready in the controller after {waited_s:.0f} s"
        crashed = [r for r in replicas if r.key == (deployment, version) and r.phase == ReplicaPhase.CRASHED]
        restarts = self._restarts[(deployment, version)]
        if crashed or restarts:
            reason += f"; {restarts} restart(s)"
            last = _describe_failure(crashed[-1]) if crashed else self._last_failure[(deployment, version)]
            reason += f"; last failure: {last}"
        return reason + "; rolled back"

    # ---- 3. traffic -------------------------------------------------------------------------
    async def _sync_traffic(self, record: DeploymentRecord, now: float) -> None:
        """The model's entry, and one per LoRA adapter with its own split (those the controller
        holds and the record no longer names are cleared)."""
        if not self.controller.connected:
            return
        wanted = {"": record.desired_traffic(), **record.desired_adapter_traffic()}
        held_entries = self.controller.traffic_entries(record.name)
        for adapter in sorted(set(wanted) | set(held_entries)):
            await self._sync_entry(record, adapter, wanted.get(adapter, {}), held_entries.get(adapter), now)

    async def _sync_entry(self, record: DeploymentRecord, adapter: str, desired: dict[str, float],
                          held: tuple[str, dict[str, float]] | None, now: float) -> None:
        key = (record.name, adapter)
        if (held is None and not desired) or held == (record.spec.model, desired):
            self._pushed.pop(key, None)
            return
        pushed = self._pushed.get(key)
        if pushed is not None and pushed[:2] == (record.spec.model, desired) and now - pushed[2] < REPUSH_S:
            return                                 # pushed (or tried) a moment ago: the table may lag
        self._pushed[key] = (record.spec.model, desired, now)
        try:
            version = await self.controller.set_traffic(record.name, record.spec.model, desired, adapter=adapter)
        except TrafficRefused as exc:
            self.metrics.errors.labels("traffic").inc()
            log.warning("traffic not pushed; trying again shortly", extra={
                "deployment": record.name, "adapter": adapter, "error": str(exc), "retry_s": REPUSH_S})
            return
        self._count(record.name, "", "traffic")
        log.info("traffic pushed to the controller", extra={
            "deployment": record.name, "model": record.spec.model, "adapter": adapter, "weights": desired,
            "routing_version": version})

    # ---- 4. replicas ------------------------------------------------------------------------
    async def _converge(self, record: DeploymentRecord, replicas: list[Replica], now: float) -> None:
        targets = record.targets()
        for name, wanted in targets.items():
            target = VersionTarget(record.spec, record.spec.version(name))
            mine = [r for r in replicas if r.key == (record.name, name) and r.phase != ReplicaPhase.STOPPING]
            slots = {r.slot for r in mine}
            if slots != set(range(wanted)):
                await self.backend.scale(target, wanted)
                self._count(record.name, name, "scale")
                log.info("scaling", extra={"deployment": record.name, "version": name, "from": len(slots),
                                           "to": wanted})
            for replica in mine:
                if (replica.phase == ReplicaPhase.CRASHED and replica.slot < wanted
                        and self.backoff.due(replica.failures, replica.exited_at, now)):
                    await self._restart(replica, target)
        for name in sorted({r.version for r in replicas if r.deployment == record.name} - set(targets)):
            await self._remove(record.name, name, replicas)

    async def _restart(self, replica: Replica, target: VersionTarget) -> None:
        key = replica.key
        self._restarts[key] += 1
        self._last_failure[key] = _describe_failure(replica)
        await self.backend.restart(replica, target)
        self._count(*key, "restart")
        self.metrics.restarts.labels(*key).inc()
        log.info("restarting a crashed replica", extra={
            "deployment": key[0], "version": key[1], "slot": replica.slot, "exit_code": replica.exit_code,
            "failures": replica.failures, "backoff_s": self.backoff.delay(replica.failures)})

    async def _remove(self, deployment: str, version: str, replicas: list[Replica]) -> None:
        if any(r.key == (deployment, version) and r.phase != ReplicaPhase.STOPPING for r in replicas):
            await self.backend.remove(deployment, version)
            self._count(deployment, version, "remove")
            log.info("removing a version", extra={"deployment": deployment, "version": version})

    async def _remove_orphans(self, names: set[str], replicas: list[Replica]) -> None:
        orphans = sorted({r.key for r in replicas if r.deployment not in names})
        if orphans and self.clock() < self.orphans_kept_until:
            self.metrics.kept_orphans.set(sum(1 for r in replicas if r.deployment not in names))
            return
        self.metrics.kept_orphans.set(0)
        for deployment, version in orphans:
            await self._remove(deployment, version, replicas)

    def _watch_epoch(self, epoch: str, created: bool, replicas: list[Replica], now: float) -> None:
        """A store that lost its data: keep the orphans for the grace period (see the top)."""
        first = self._epoch is None
        reset = (not first and epoch != self._epoch) or (first and created and bool(replicas))
        self._epoch = epoch
        if not reset:
            return
        self.orphans_kept_until = now + self.orphan_grace_s
        self.metrics.store_resets.inc()
        log.warning("the store lost its data; replicas no record names are kept until their specs come back",
                    extra={"grace_s": self.orphan_grace_s, "replicas": len(replicas)})

    # ---- 5. deletions -----------------------------------------------------------------------
    async def _forget_deleted(self, records: list[DeploymentRecord], replicas: list[Replica]) -> None:
        for record in records:
            if not record.deleting or any(r.deployment == record.name for r in replicas):
                continue
            if not self.controller.connected or self.controller.traffic_entries(record.name):
                continue                                   # the traffic entries must be gone first
            await self.deployments.update(record.name, lambda r: REMOVE if r.deleting else None)
            self._count(record.name, "", "forget")
            log.info("deployment deleted", extra={"deployment": record.name})

    # ---- 6. status --------------------------------------------------------------------------
    def _publish(self, records: list[DeploymentRecord], replicas: list[Replica]) -> None:
        status: dict[str, list[VersionStatus]] = {}
        for record in records:
            targets = record.targets()
            running = {r.version for r in replicas if r.deployment == record.name}
            rows = []
            for name in [*targets, *sorted(running - set(targets))]:
                key = (record.name, name)
                alive = sum(1 for r in replicas
                            if r.key == key and r.phase not in (ReplicaPhase.CRASHED, ReplicaPhase.STOPPING))
                rows.append(VersionStatus(
                    version=name, desired=targets.get(name, 0), running=alive,
                    ready=self.controller.ready(*key), restarts=self._restarts[key],
                    weight=record.desired_traffic().get(name, 0.0), last_failure=self._last_failure.get(key, "")))
            status[record.name] = rows
        self.status = status
        self.metrics.set_versions([(d, v.version, v.desired, v.running, v.ready, v.weight)
                                   for d, rows in status.items() for v in rows])
        self.metrics.set_rollouts({r.name: r.rollout.phase for r in records if r.rollout is not None})

    def _count(self, deployment: str, version: str, action: str) -> None:
        self.metrics.actions.labels(deployment, version, action).inc()


def _describe_failure(replica: Replica) -> str:
    where = f", log {replica.log}" if replica.log else ""
    return f"slot {replica.slot} exited with code {replica.exit_code}{where}"
