"""The reconcile loop's decisions, pass by pass, with an in-memory backend and controller view and
a clock the test moves: scaling, restarts after their backoff, traffic pushes, a rollout's
deadline, deletions, orphans, and the status it publishes. (The same loop with real processes:
test_local_deployments.py, test_rollouts.py.)"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from mindmotor.common.store import MemoryStore
from mindmotor.vocabulary import ReplicaPhase
from mindmotor.deployer.backends.base import Replica
from mindmotor.runtime.backoff import RestartBackoff
from mindmotor.deployer.metrics import DeployerMetrics
from mindmotor.deployer.operations import Deployments
from mindmotor.deployer.reconcile import REPUSH_S, Reconciler
from mindmotor.deployer.spec import parse_spec
from mindmotor.deployer.store import DeploymentStore

from .doubles import Clock, ControllerView, MemoryBackend


@dataclass
class Loop:
    reconciler: Reconciler
    ops: Deployments
    backend: MemoryBackend
    view: ControllerView
    clock: Clock
    checkpoint: str

    async def step(self):
        await self.reconciler.reconcile_once()

    def spec(self, *versions, **fields):
        return parse_spec({"name": "demo", "model": "m",
                           "versions": [{"checkpoint": self.checkpoint, **v} for v in versions], **fields})


@pytest.fixture
def loop(tiny_ckpt):
    store, clock = DeploymentStore(MemoryStore()), Clock()
    backend, view = MemoryBackend(), ControllerView()
    reconciler = Reconciler(store, backend, view, DeployerMetrics(), backoff=RestartBackoff(0.5, 4.0), clock=clock)
    ops = Deployments(store, on_change=reconciler.poke, rollout_timeout_s=10, clock=clock)
    return Loop(reconciler, ops, backend, view, clock, str(tiny_ckpt))


def count(loop, action, version="v1") -> float:
    labels = {"deployment": "demo", "version": version, "action": action}
    return loop.reconciler.metrics.registry.get_sample_value("mindmotor_deployer_reconcile_actions_total", labels) or 0


@pytest.mark.asyncio
async def test_scaling_is_idempotent_and_status_is_published(loop):
    await loop.ops.apply(loop.spec({"name": "v1", "replicas": 2}))
    await loop.step()
    await loop.step()
    assert loop.backend.calls == [("scale", "demo", "v1", 2)] and count(loop, "scale") == 1
    assert loop.view.pushes == [("demo", {"v1": 1.0})]

    loop.view.ready_counts[("demo", "v1")] = 2
    await loop.step()
    (status,) = loop.reconciler.status["demo"]
    assert (status.desired, status.running, status.ready, status.weight) == (2, 2, 2, 1.0)
    sample = loop.reconciler.metrics.registry.get_sample_value
    assert sample("mindmotor_deployer_ready_replicas", {"deployment": "demo", "version": "v1"}) == 2

    await loop.ops.apply(loop.spec({"name": "v1", "replicas": 1}))
    await loop.step()
    assert loop.backend.calls[-1] == ("scale", "demo", "v1", 1) and len(loop.backend.replicas) == 1


@pytest.mark.asyncio
async def test_a_crashed_replica_waits_for_its_backoff(loop):
    await loop.ops.apply(loop.spec({"name": "v1", "replicas": 1}))
    await loop.step()
    key = ("demo", "v1", 0)
    for failures, delay in ((1, 0.5), (3, 2.0), (9, 4.0)):                   # 0.5 s doubling, at most 4 s
        loop.backend.replicas[key] = Replica("demo", "v1", 0, ReplicaPhase.CRASHED, exited_at=loop.clock.now,
                                             exit_code=1, failures=failures, log="/logs/demo-v1-0.log")
        loop.clock.now += delay - 0.01
        await loop.step()
        assert loop.backend.replicas[key].phase == ReplicaPhase.CRASHED
        loop.clock.now += 0.02
        await loop.step()
        assert loop.backend.replicas[key].phase == ReplicaPhase.STARTING
    assert loop.reconciler.status["demo"][0].restarts == 3 and count(loop, "restart") == 3
    assert loop.reconciler.status["demo"][0].last_failure == "slot 0 exited with code 1, log /logs/demo-v1-0.log"


@pytest.mark.asyncio
async def test_traffic_is_pushed_when_the_table_differs(loop):
    loop.view.connected = False
    await loop.ops.apply(loop.spec({"name": "v1"}, {"name": "v2"}, traffic={"v1": 3, "v2": 1}))
    await loop.step()
    assert loop.view.pushes == []                                     # nothing to push to

    loop.view.connected, loop.view.deaf = True, True
    await loop.step()
    await loop.step()                                       # the table has not caught up: wait
    assert loop.view.pushes == [("demo", {"v1": 3, "v2": 1})]
    loop.clock.now += REPUSH_S + 0.1
    await loop.step()                                       # ... then push again
    assert len(loop.view.pushes) == 2

    loop.view.deaf = False
    loop.view.table["demo"] = ("m", {"v1": 1})                        # e.g. a controller that lost it
    await loop.ops.set_traffic("demo", {"v1": 1, "v2": 1})
    await loop.step()
    await loop.step()
    assert loop.view.pushes[-1] == ("demo", {"v1": 1, "v2": 1}) and len(loop.view.pushes) == 3


@pytest.mark.asyncio
async def test_a_rollout_turns_canary_when_ready_or_fails_at_its_deadline(loop):
    await loop.ops.apply(loop.spec({"name": "v1", "replicas": 1}, traffic={"v1": 100}))
    await loop.step()
    await loop.ops.rollout("demo", "v2", loop.checkpoint, canary=20)
    await loop.step()
    assert ("scale", "demo", "v2", 1) in loop.backend.calls
    loop.view.ready_counts[("demo", "v2")] = 1
    await loop.step()
    record = await loop.ops.get("demo")
    assert (record.rollout.phase, record.spec.traffic) == ("canary", {"v1": 80, "v2": 20})
    assert loop.view.table["demo"] == ("m", {"v1": 80, "v2": 20})
    await loop.ops.roll_back("demo")
    await loop.step()
    assert ("remove", "demo", "v2") in loop.backend.calls

    await loop.ops.rollout("demo", "v3", "", canary=20, ready_timeout_s=5, allow_tokenizer_change=True)
    await loop.step()
    loop.backend.replicas[("demo", "v3", 0)] = Replica("demo", "v3", 0, ReplicaPhase.CRASHED, exited_at=loop.clock.now,
                                                       exit_code=1, failures=1)
    loop.clock.now += 5.5
    await loop.step()
    record = await loop.ops.get("demo")
    assert record.rollout.phase == "failed" and record.spec.version_names() == ["v1"]
    assert record.rollout.reason == ("0 of 1 replica(s) of v3 ready in the controller after 6 s; 0 restart(s); "
                                     "last failure: slot 0 exited with code 1; rolled back")
    assert count(loop, "rollout_failed", "v3") == 1
    await loop.step()
    assert loop.backend.calls[-1] == ("remove", "demo", "v3")


@pytest.mark.asyncio
async def test_deletion_and_orphans(loop):
    await loop.ops.apply(loop.spec({"name": "v1", "replicas": 2}))
    await loop.step()
    loop.backend.replicas[("ghost", "v9", 0)] = Replica("ghost", "v9", 0, ReplicaPhase.RUNNING)     # no record names it
    await loop.ops.delete("demo")
    await loop.step()
    assert {("remove", "demo", "v1"), ("remove", "ghost", "v9")} <= set(loop.backend.calls)
    assert loop.view.pushes[-1] == ("demo", {}) and "demo" not in loop.view.table
    await loop.step()
    assert await loop.ops.list() == [] and count(loop, "forget", "") == 1
