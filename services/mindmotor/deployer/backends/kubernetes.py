"""`KubernetesBackend`: a version's replicas are pods of the Kubernetes Deployments rendered by
`manifests.render_version`, applied through a `KubeAPI`.

Kubernetes does the per-pod work itself: it replaces a crashed container (with its own
CrashLoopBackOff), and scaling a Deployment down sends SIGTERM to the pods it removes (the worker
drains) — so this backend only applies desired counts and reads them back. A version's replicas
are reported per Deployment: as many as its `spec.replicas`, "running" up to its
`status.readyReplicas`, "starting" beyond; a crashed replica is never reported (Kubernetes
restarts it in place), which is why `restart` is never called here.

The Deployments outlive the deployer: a stopped deployer leaves the pods serving; a restarted one
finds them (`observe` lists them by label) and carries on.
"""

from __future__ import annotations

import logging

from mindmotor.vocabulary import ReplicaPhase

from .base import Backend, Replica, VersionTarget
from .kube_api import KubeAPI
from .manifests import DEPLOYER, DEPLOYMENT_LABEL, VERSION_LABEL, managed_by, object_name, render_version, version_labels

log = logging.getLogger("mindmotor.deployer")


class KubernetesBackend(Backend):
    kind = "kubernetes"

    def __init__(self, api: KubeAPI, namespace: str, image: str, controller: str,
                 checkpoint_claim: str | None = None, checkpoint_mount: str = "/checkpoints",
                 manager: str = DEPLOYER, owner: dict | None = None, pod_annotations: dict[str, str] | None = None):
        """`manager`: the managed-by label of what it creates and lists (the operator passes its
        own, with the ownerReference of the InferenceService and the pods' annotations)."""
        self.api = api
        self.manager = manager
        self.owner = owner
        self.pod_annotations = pod_annotations
        self.namespace = namespace
        self.image = image
        self.controller = controller
        self.checkpoint_claim = checkpoint_claim
        self.checkpoint_mount = checkpoint_mount

    async def observe(self) -> list[Replica]:
        objects = await self.api.list("Deployment", self.namespace, managed_by(self.manager))
        counts: dict[tuple[str, str], list[int]] = {}
        for obj in objects:
            labels = obj["metadata"].get("labels", {})
            key = (labels.get(DEPLOYMENT_LABEL, ""), labels.get(VERSION_LABEL, ""))
            desired = int(obj.get("spec", {}).get("replicas", 0))
            ready = min(desired, int(obj.get("status", {}).get("readyReplicas", 0) or 0))
            total = counts.setdefault(key, [0, 0])
            total[0], total[1] = total[0] + desired, total[1] + ready
        return [Replica(deployment=d, version=v, slot=slot,
                        phase=ReplicaPhase.RUNNING if slot < ready else ReplicaPhase.STARTING)
                for (d, v), (desired, ready) in sorted(counts.items()) for slot in range(desired)]

    async def scale(self, target: VersionTarget, replicas: int) -> None:
        for manifest in render_version(target, replicas, self.namespace, self.image, self.controller,
                                       self.checkpoint_claim, self.checkpoint_mount, self.manager, self.owner,
                                       self.pod_annotations):
            await self.api.apply(manifest)
        log.info("applied", extra={"deployment": target.deployment.name, "version": target.version.name,
                                   "replicas": replicas, "namespace": self.namespace})

    async def restart(self, replica: Replica, target: VersionTarget) -> None:
        raise RuntimeError("Kubernetes restarts crashed containers itself; this backend reports none crashed")

    async def remove(self, deployment: str, version: str) -> None:
        for obj in await self.api.list("Deployment", self.namespace, version_labels(deployment, version, self.manager)):
            await self.api.delete("Deployment", self.namespace, obj["metadata"]["name"])
        await self.api.delete("Service", self.namespace, object_name(deployment, version))
        log.info("deleted", extra={"deployment": deployment, "version": version, "namespace": self.namespace})

    async def close(self) -> None:
        await self.api.close()
