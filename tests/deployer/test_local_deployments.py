"""The deployer with its local backend, as processes: a controller, the deployer, and the worker
replicas it starts — applied, restarted after a crash, scaled, deleted."""

from __future__ import annotations

import os
import signal

import grpc
import httpx
import pytest

from mindmotor.common.waiting import wait_until

from .conftest import owned_get, replica_pids


def test_apply_starts_replicas_that_register_with_their_deployment_and_version(cluster):
    cluster.start_controller()
    deployer = cluster.start_deployer()
    client = cluster.client(deployer)
    spec = cluster.spec({"name": "v1", "replicas": 2})

    applied = client.apply(spec)
    assert applied.generation == 1 and [v.name for v in applied.spec.versions] == ["v1"]
    assert dict(applied.spec.traffic) == {"v1": 1.0}

    ready = cluster.wait_ready("v1", 2)
    assert sorted(ready) == [f"{cluster.deployment}-v1-0", f"{cluster.deployment}-v1-1"]
    assert {(i["model"], i["deployment"], i["version"], i["role"]) for i in ready.values()} == \
        {(cluster.model, cluster.deployment, "v1", "mixed")}
    status = wait_until(lambda: (s := client.get(cluster.deployment).versions[0]).running == 2 and s.ready == 2 and s,
                        what="the status to show 2 running, 2 ready")
    assert (status.version, status.desired, status.restarts) == ("v1", 2, 0)

    again = client.apply(spec)                         # idempotent: nothing changes
    assert again.generation == 1
    assert len(replica_pids(cluster.deployment)) == 2
    metrics = httpx.get(f"http://127.0.0.1:{deployer.ready['metrics_port']}/metrics", timeout=5).text
    labels = f'deployment="{cluster.deployment}",version="v1"'
    assert f"mindmotor_deployer_desired_replicas{{{labels}}} 2.0" in metrics
    assert f"mindmotor_deployer_ready_replicas{{{labels}}} 2.0" in metrics


def test_a_killed_replica_is_restarted_and_scaling_down_drains(cluster):
    cluster.start_controller()
    client = cluster.client(cluster.start_deployer())
    client.apply(cluster.spec({"name": "v1", "replicas": 2}))
    cluster.wait_ready("v1", 2)
    victim = f"{cluster.deployment}-v1-1"
    old_pid = replica_pids(cluster.deployment)[victim]

    os.kill(old_pid, signal.SIGKILL)
    new_pid = wait_until(lambda: (pid := replica_pids(cluster.deployment).get(victim)) not in (None, old_pid) and pid,
                         what="the killed replica to be started again")
    assert new_pid != old_pid
    wait_until(lambda: cluster.ready_instances("v1").get(victim, {}).get("address")
               and len(cluster.ready_instances("v1")) == 2, what="the restarted replica to be ready again")
    status = wait_until(lambda: (s := client.get(cluster.deployment).versions[0]).restarts == 1 and s,
                        what="the restart to be counted")
    assert "exited with code -9" in status.last_failure

    client.apply(cluster.spec({"name": "v1", "replicas": 1}))       # scale down: the highest slot drains
    wait_until(lambda: set(replica_pids(cluster.deployment)) == {f"{cluster.deployment}-v1-0"},
               what="slot 1 to drain and exit")
    wait_until(lambda: set(cluster.ready_instances("v1")) == {f"{cluster.deployment}-v1-0"},
               what="the controller to show one instance")


def test_delete_drains_everything_and_clears_the_traffic(cluster):
    cluster.start_controller()
    client = cluster.client(cluster.start_deployer())
    client.apply(cluster.spec({"name": "v1", "replicas": 1}))
    cluster.wait_ready("v1", 1)

    deleting = client.delete(cluster.deployment)
    assert deleting.deleting
    client.wait_gone(cluster.deployment, timeout_s=20)
    assert replica_pids(cluster.deployment) == {}
    cluster.wait_gone("v1")
    with pytest.raises(grpc.RpcError) as refused:
        client.get(cluster.deployment)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_restarted_deployer_recovers_its_deployments_from_redis(cluster, redis_prefix):
    cluster.start_controller()
    first = cluster.start_deployer(redis_prefix=redis_prefix)
    applied = cluster.client(first).apply(cluster.spec({"name": "v1", "replicas": 1}))
    cluster.wait_ready("v1", 1)
    old_pids = replica_pids(cluster.deployment)

    first.kill()                                  # SIGKILL: the kernel SIGKILLs its replicas too
    wait_until(lambda: not set(replica_pids(cluster.deployment).values()) & set(old_pids.values()),
               what="the dead deployer's replicas to exit")
    second = cluster.start_deployer(redis_prefix=redis_prefix)
    client = cluster.client(second)

    # the dead deployer's owner lease runs out first (two lease periods at most)
    recovered = wait_until(lambda: owned_get(client, cluster.deployment), timeout=10,
                           what="the new deployer to own the deployments")
    assert recovered.spec == applied.spec and recovered.generation == applied.generation
    wait_until(lambda: len(pids := replica_pids(cluster.deployment)) == 1 and pids != old_pids,
               what="the replica to be started again by the new deployer")
    cluster.wait_ready("v1", 1)
