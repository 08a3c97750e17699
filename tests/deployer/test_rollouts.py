"""Rollouts through the deployer's gRPC API, with real replicas: canary then promote, a refused
checkpoint, an operator's rollback, and a rollout whose replicas never get ready."""

from __future__ import annotations

import grpc
import pytest

from mindmotor.common.waiting import wait_until

from .conftest import replica_pids


def controller_traffic(cluster) -> dict:
    """The weights the controller's routing table carries for the test's deployment."""
    import asyncio

    from mindmotor.controller.client import RoutingTableWatcher

    async def read():
        watcher = RoutingTableWatcher(cluster.controller_address)
        await watcher.start()
        try:
            table = await watcher.wait_for(lambda t: True, timeout=10)
        finally:
            await watcher.stop()
        return next((dict(t.weights) for t in table.traffic if t.deployment == cluster.deployment), {})

    return asyncio.run(read())


def test_canary_then_promote(cluster, manifest_ckpt):
    cluster.start_controller()
    client = cluster.client(cluster.start_deployer())
    client.apply(cluster.spec({"name": "v1", "replicas": 1}, traffic={"v1": 100}))
    cluster.wait_ready("v1", 1)

    started = client.rollout(cluster.deployment, "v2", checkpoint=str(manifest_ckpt), canary=25)
    assert started.rollout.phase == "starting" and started.rollout.previous == "v1"
    assert dict(started.spec.traffic) == {"v1": 100}              # no traffic before it is ready
    assert [(v.name, v.replicas, v.checkpoint) for v in started.spec.versions][1] == ("v2", 1, str(manifest_ckpt))

    canary = client.wait_rollout(cluster.deployment, timeout_s=30)
    assert canary.rollout.phase == "canary", canary.rollout.reason
    assert dict(canary.spec.traffic) == {"v1": 75, "v2": 25}
    assert cluster.ready_instances("v2")
    wait_until(lambda: controller_traffic(cluster) == {"v1": 75, "v2": 25}, what="the canary weights in the controller")

    promoted = client.promote(cluster.deployment)
    assert promoted.rollout.phase == "promoted"
    assert [v.name for v in promoted.spec.versions] == ["v2"] and dict(promoted.spec.traffic) == {"v2": 100}
    cluster.wait_gone("v1")
    wait_until(lambda: set(replica_pids(cluster.deployment)) == {f"{cluster.deployment}-v2-0"},
               what="v1's replica to drain and exit")
    wait_until(lambda: controller_traffic(cluster) == {"v2": 100}, what="v2 to hold all the traffic")
    with pytest.raises(grpc.RpcError) as refused:
        client.rollback(cluster.deployment)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "promoted" in refused.value.details()


def test_a_bad_checkpoint_is_refused_and_nothing_changes(cluster, tampered_ckpt, tmp_path):
    cluster.start_controller()
    client = cluster.client(cluster.start_deployer())
    client.apply(cluster.spec({"name": "v1", "replicas": 1}))
    cluster.wait_ready("v1", 1)
    before = client.get(cluster.deployment)

    for checkpoint, expected in ((tampered_ckpt, "tokenizer_config.json: sha256"),
                                 (tmp_path / "missing", "does not exist")):
        with pytest.raises(grpc.RpcError) as refused:
            client.rollout(cluster.deployment, "v2", checkpoint=str(checkpoint), canary=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert expected in refused.value.details()

    after = client.get(cluster.deployment)
    assert (after.spec, after.generation, after.HasField("rollout")) == (before.spec, before.generation, False)
    assert set(replica_pids(cluster.deployment)) == {f"{cluster.deployment}-v1-0"}


def test_rollback_returns_the_traffic_and_removes_the_new_version(cluster):
    cluster.start_controller()
    client = cluster.client(cluster.start_deployer())
    client.apply(cluster.spec({"name": "v1", "replicas": 1}, traffic={"v1": 100}))
    cluster.wait_ready("v1", 1)
    client.rollout(cluster.deployment, "v2", checkpoint=str(cluster.model_dir), canary=10)
    assert client.wait_rollout(cluster.deployment, timeout_s=30).rollout.phase == "canary"

    with pytest.raises(grpc.RpcError) as refused:                  # one rollout at a time
        client.rollout(cluster.deployment, "v3", checkpoint=str(cluster.model_dir), canary=10, previous="v1")
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    rolled_back = client.rollback(cluster.deployment, reason="latency regression")
    assert (rolled_back.rollout.phase, rolled_back.rollout.reason) == ("rolled_back", "latency regression")
    assert [v.name for v in rolled_back.spec.versions] == ["v1"] and dict(rolled_back.spec.traffic) == {"v1": 100}
    cluster.wait_gone("v2")
    wait_until(lambda: set(replica_pids(cluster.deployment)) == {f"{cluster.deployment}-v1-0"},
               what="v2's replica to drain and exit")
    wait_until(lambda: controller_traffic(cluster) == {"v1": 100}, what="v1 to hold all the traffic again")


def test_a_rollout_that_never_gets_ready_rolls_back_by_itself(cluster, unloadable_ckpt):
    cluster.start_controller()
    client = cluster.client(cluster.start_deployer())
    client.apply(cluster.spec({"name": "v1", "replicas": 1}, traffic={"v1": 100}))
    cluster.wait_ready("v1", 1)

    # long enough for the replica to fail at least once however loaded the machine (a worker's start
    # took over 3 s on a busy CI host: the reason then had no exit to name)
    client.rollout(cluster.deployment, "v2", checkpoint=str(unloadable_ckpt), canary=50, ready_timeout_s=8)
    failed = client.wait_rollout(cluster.deployment, timeout_s=40)

    assert failed.rollout.phase == "failed"
    reason = failed.rollout.reason
    assert reason.startswith("0 of 1 replica(s) of v2 ready in the controller after 8 s") and "rolled back" in reason
    assert "exited with code 1" in reason and "restart(s)" in reason
    assert [v.name for v in failed.spec.versions] == ["v1"] and dict(failed.spec.traffic) == {"v1": 100}
    wait_until(lambda: set(replica_pids(cluster.deployment)) == {f"{cluster.deployment}-v1-0"},
               what="no replica of v2 left")
    assert set(cluster.ready_instances()) == {f"{cluster.deployment}-v1-0"}
