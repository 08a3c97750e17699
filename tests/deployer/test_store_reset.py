"""A store that loses its data must not make the deployer destroy running work: on a real Redis,
the deployer's keys are flushed under a running deployment (as a Redis restarted empty would
have them). The loop sees the store's epoch change, keeps the replicas no record names any more
(counted: store_resets, kept_orphans), adopts them again when the spec is applied again (nothing
is restarted, scaled or removed), and removes replicas that stay orphans past the grace."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from mindmotor.common.store import open_store
from mindmotor.vocabulary import ReplicaPhase
from mindmotor.runtime.backoff import RestartBackoff
from mindmotor.deployer.metrics import DeployerMetrics
from mindmotor.deployer.operations import Deployments
from mindmotor.deployer.reconcile import Reconciler
from mindmotor.deployer.spec import parse_spec
from mindmotor.deployer.store import DeploymentStore
from service_processes import REDIS_URL

from .doubles import Clock, ControllerView, MemoryBackend


def sample(reconciler: Reconciler, name: str) -> float:
    return reconciler.metrics.registry.get_sample_value(name) or 0.0


@pytest.mark.asyncio
async def test_an_emptied_store_keeps_the_replicas_until_the_spec_is_back(tiny_ckpt):
    store = open_store(REDIS_URL, prefix=f"test-reset-{uuid.uuid4().hex[:8]}:deployer:")
    clock, backend, view = Clock(), MemoryBackend(), ControllerView()
    deployments = DeploymentStore(store)
    reconciler = Reconciler(deployments, backend, view, DeployerMetrics(), backoff=RestartBackoff(0.5, 4.0),
                            clock=clock, orphan_grace_s=20.0)
    ops = Deployments(deployments, on_change=reconciler.poke, rollout_timeout_s=10, clock=clock)
    spec = parse_spec({"name": "demo", "model": "m",
                       "versions": [{"name": "v1", "checkpoint": str(tiny_ckpt), "replicas": 2}]})
    try:
        await ops.apply(spec)
        await reconciler.reconcile_once()
        for key, replica in list(backend.replicas.items()):
            backend.replicas[key] = replace(replica, phase=ReplicaPhase.RUNNING)
        assert sample(reconciler, "mindmotor_deployer_store_resets_total") == 0

        assert await store.clear() > 0                     # Redis back without its data
        clock.now += 1
        await reconciler.reconcile_once()
        await reconciler.reconcile_once()
        assert len(backend.replicas) == 2 and not [c for c in backend.calls if c[0] == "remove"]
        assert sample(reconciler, "mindmotor_deployer_store_resets_total") == 1
        assert sample(reconciler, "mindmotor_deployer_kept_orphans") == 2

        calls = len(backend.calls)
        await ops.apply(spec)                              # `up` applies its deployments again
        clock.now += 1
        await reconciler.reconcile_once()
        assert backend.calls[calls:] == [] and len(backend.replicas) == 2      # taken over as they run
        assert sample(reconciler, "mindmotor_deployer_kept_orphans") == 0

        await store.clear()                                # lost again, and this time never re-applied
        clock.now += 1
        await reconciler.reconcile_once()
        assert len(backend.replicas) == 2
        clock.now += 20.5                                  # past the grace: orphans now
        await reconciler.reconcile_once()
        assert backend.calls[-1] == ("remove", "demo", "v1") and backend.replicas == {}
        assert sample(reconciler, "mindmotor_deployer_store_resets_total") == 2
    finally:
        await store.clear()
        await store.close()


@pytest.mark.asyncio
async def test_an_intact_store_removes_orphans_at_once(tiny_ckpt):
    """No reset (the epoch is the one seen before): a replica no record names is removed in the
    same pass, as before."""
    store = open_store(REDIS_URL, prefix=f"test-reset-{uuid.uuid4().hex[:8]}:deployer:")
    clock, backend, view = Clock(), MemoryBackend(), ControllerView()
    reconciler = Reconciler(DeploymentStore(store), backend, view, DeployerMetrics(), clock=clock)
    try:
        await reconciler.reconcile_once()
        from mindmotor.deployer.backends.base import Replica

        backend.replicas[("ghost", "v9", 0)] = Replica("ghost", "v9", 0, ReplicaPhase.RUNNING)
        await reconciler.reconcile_once()
        assert backend.calls == [("remove", "ghost", "v9")]
        assert sample(reconciler, "mindmotor_deployer_store_resets_total") == 0
    finally:
        await store.clear()
        await store.close()
