"""Several deployers on one Redis prefix: the holder of the owner lease acts and answers, the others
stand by (UNAVAILABLE, no replicas of their own) and take over when it goes; an owner that finds
another deployer holding the lease drains its local replicas, so two never run side by side."""

from __future__ import annotations

import grpc
import pytest
import redis

from mindmotor.common.waiting import wait_until

from service_processes import REDIS_URL

from .conftest import owned_get, replica_pids


def deployer_of(pid: int, deployers) -> str:
    """Which deployer process a replica belongs to (its parent)."""
    with open(f"/proc/{pid}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    return next(d.name for d in deployers if d.proc.pid == ppid)


def test_a_standby_refuses_and_takes_over_when_the_owner_stops(cluster, redis_prefix):
    cluster.start_controller()
    owner = cluster.start_deployer("--deployer-id", "first", redis_prefix=redis_prefix)
    owner.name = "first"
    cluster.client(owner).apply(cluster.spec({"name": "v1", "replicas": 1}))
    cluster.wait_ready("v1", 1)
    standby = cluster.start_deployer("--deployer-id", "second", redis_prefix=redis_prefix)
    standby.name = "second"

    with pytest.raises(grpc.RpcError) as refused:
        cluster.client(standby).get(cluster.deployment)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and "standby" in refused.value.details()
    pids = replica_pids(cluster.deployment)
    assert len(pids) == 1 and deployer_of(next(iter(pids.values())), [owner, standby]) == "first"

    owner.stop(timeout_s=15)                     # SIGTERM: drains its replica, then releases the lease
    got = wait_until(lambda: owned_get(cluster.client(standby), cluster.deployment), timeout=10,
                     what="the standby to own the deployments")
    assert got.spec.name == cluster.deployment
    wait_until(lambda: len(p := replica_pids(cluster.deployment)) == 1
               and deployer_of(next(iter(p.values())), [standby]) == "second",
               what="the new owner to start the replica")
    cluster.wait_ready("v1", 1)


def test_an_owner_that_sees_another_holder_drains_its_replicas_until_it_owns_again(cluster, redis_prefix):
    cluster.start_controller()
    owner = cluster.start_deployer("--deployer-id", "first", redis_prefix=redis_prefix)
    cluster.client(owner).apply(cluster.spec({"name": "v1", "replicas": 1}))
    cluster.wait_ready("v1", 1)

    store = redis.Redis.from_url(REDIS_URL)
    lease = f"{redis_prefix}deployer:lease:owner"
    assert store.get(lease) == b"first"
    store.set(lease, "intruder", px=3000)        # another deployer took the lease (e.g. after a partition)
    wait_until(lambda: not replica_pids(cluster.deployment), timeout=15,
               what="the displaced owner to drain its replica")
    with pytest.raises(grpc.RpcError) as refused:
        cluster.client(owner).list()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

    # the intruder's lease runs out unrenewed: the deployer owns again and restarts the replica
    wait_until(lambda: owned_get(cluster.client(owner), cluster.deployment), timeout=10,
               what="the deployer to own the deployments again")
    cluster.wait_ready("v1", 1)
    store.close()
