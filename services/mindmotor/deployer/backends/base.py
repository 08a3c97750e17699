"""What a backend is to the reconcile loop: something that runs a version's replicas and says what
runs. The loop decides (how many, when to restart a crashed replica); the backend executes.

    replicas = await backend.observe()                      # everything it runs, every deployment
    await backend.scale(VersionTarget(spec, version), 3)    # start or drain replicas to reach 3
    await backend.restart(replica, VersionTarget(...))      # a crashed replica, in its place
    await backend.remove("demo", "v1")                      # drain every replica of a version

Replicas are numbered per version (`slot` 0..n-1); a version's role counts give each slot its role
(`VersionSpec.role_of`). Scaling down drains the highest slots first.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from ..spec import DeploymentSpec, VersionSpec

from mindmotor.vocabulary import ReplicaPhase


@dataclass(frozen=True)
class VersionTarget:
    """What a version's replicas run: the deployment (name, served model) and the version."""

    deployment: DeploymentSpec
    version: VersionSpec

    @property
    def key(self) -> tuple[str, str]:
        return self.deployment.name, self.version.name


@dataclass(frozen=True)
class Replica:
    deployment: str
    version: str
    slot: int
    phase: ReplicaPhase
    instance_id: str = ""       # the id it registers with the controller
    started_at: float = 0.0     # unix seconds
    exited_at: float = 0.0      # CRASHED: when
    exit_code: int | None = None
    failures: int = 0           # CRASHED: crashes in a row, each soon after its start
    log: str = ""               # where its log is ("" if the backend keeps none)

    @property
    def key(self) -> tuple[str, str]:
        return self.deployment, self.version


class Backend(abc.ABC):
    kind: str                   # "local" | "kubernetes"

    @abc.abstractmethod
    async def observe(self) -> list[Replica]:
        """Every replica this backend runs for any deployment (stopping and crashed ones too)."""

    @abc.abstractmethod
    async def scale(self, target: VersionTarget, replicas: int) -> None:
        """Start replicas (slots 0..replicas-1 that have none) or drain the ones above."""

    @abc.abstractmethod
    async def restart(self, replica: Replica, target: VersionTarget) -> None:
        """Start a crashed replica again in its slot."""

    @abc.abstractmethod
    async def remove(self, deployment: str, version: str) -> None:
        """Drain every replica of a version that is no longer wanted."""

    async def yield_replicas(self) -> None:
        """Another deployer owns the deployments now: stop the replicas it cannot see (local
        processes, children of this one), leave those it can (Kubernetes objects: the default)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """The deployer is stopping: stop what dies with it (local processes), leave the rest."""
