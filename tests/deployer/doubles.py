"""Test doubles for the reconcile loop's two neighbours — a backend that keeps replicas in a dict
and a controller view the test sets — and a clock the test moves. The loop's real neighbours run
as processes in test_local_deployments.py and test_rollouts.py."""

from __future__ import annotations

from dataclasses import replace

from mindmotor.vocabulary import ReplicaPhase
from mindmotor.deployer.backends.base import Backend, Replica


class MemoryBackend(Backend):
    kind = "memory"

    def __init__(self):
        self.replicas: dict[tuple[str, str, int], Replica] = {}
        self.calls: list[tuple] = []

    async def observe(self):
        return list(self.replicas.values())

    async def scale(self, target, replicas):
        self.calls.append(("scale", *target.key, replicas))
        for slot in range(replicas):
            self.replicas.setdefault((*target.key, slot), Replica(*target.key, slot, ReplicaPhase.STARTING))
        for key in [k for k in self.replicas if k[:2] == target.key and k[2] >= replicas]:
            del self.replicas[key]

    async def restart(self, replica, target):
        self.calls.append(("restart", replica.deployment, replica.version, replica.slot))
        key = (replica.deployment, replica.version, replica.slot)
        self.replicas[key] = replace(replica, phase=ReplicaPhase.STARTING)

    async def remove(self, deployment, version):
        self.calls.append(("remove", deployment, version))
        for key in [k for k in self.replicas if k[:2] == (deployment, version)]:
            del self.replicas[key]

    async def close(self):
        pass


class ControllerView:
    """What `ControllerLink` tells the loop, set by the test; pushes land in the table at once
    unless `deaf`."""

    def __init__(self):
        self.connected = True
        self.ready_counts: dict[tuple[str, str], int] = {}
        self.table: dict[str, tuple[str, dict]] = {}
        self.pushes: list[tuple] = []
        self.deaf = False

    def ready(self, deployment, version):
        return self.ready_counts.get((deployment, version), 0)

    def traffic(self, deployment, adapter=""):
        return self.table.get(f"{deployment}@{adapter}" if adapter else deployment)

    def traffic_entries(self, deployment):
        return {key.partition("@")[2]: entry for key, entry in self.table.items()
                if key.partition("@")[0] == deployment}

    async def set_traffic(self, deployment, model, weights, adapter=""):
        key = f"{deployment}@{adapter}" if adapter else deployment
        self.pushes.append((key, dict(weights)))
        if not self.deaf:
            if weights:
                self.table[key] = (model, dict(weights))
            else:
                self.table.pop(key, None)
        return len(self.pushes)


class Clock:
    now = 1000.0

    def __call__(self):
        return self.now
