"""`ServiceReconciler`: one InferenceService into the Deployer's Kubernetes backend.

Level-triggered and idempotent, like the Deployer's own loop (deployer/reconcile.py); a pass

1. reads the spec (`resource.parse_resource`: a bad one is reported in the status, nothing acts)
   and what runs: the backend's replicas of this service (Deployments it manages, labelled
   `managed-by: mindmotor-operator` and owned by the InferenceService), ready as Kubernetes says
   (`readyReplicas`: the pods pass the worker's gRPC readiness probe);
2. scales every wanted version — the serving one at `replicas`, the canary at its own — through
   `KubernetesBackend.scale` (server-side apply of `manifests.render_version`); applies again
   after a spec change (a new generation) even when the counts match;
3. pushes the traffic weights (`traffic.py`): all to the serving version, the canary's percent to
   the canary once all its replicas are ready; while a replaced version still runs and the new
   serving version is not ready, the old one keeps the traffic (make before break);
4. removes versions the spec no longer names — a rolled-back canary, the version a promoted canary
   replaced — once the serving version is ready;
5. returns the status: per version desired / ready / weight, the conditions (`Ready`,
   `Progressing`, `Canary`, `TrafficRouted`), `replicas`/`readyReplicas`/`selector` for the scale
   subresource.

`delete` removes every version and the traffic entry (the finalizer's handler). One pass at a time
per InferenceService (the event handlers and the resync timer share a lock).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any, Callable

from mindmotor.deployer.backends.base import Replica, VersionTarget
from mindmotor.deployer.backends.kube_api import KubeAPI, KubeAPIError, label_selector
from mindmotor.deployer.backends.kubernetes import KubernetesBackend
from mindmotor.deployer.backends.manifests import version_labels
from mindmotor.vocabulary import ReplicaPhase, ServiceCondition, ServiceReason

from .resource import API_VERSION, KIND, InferenceServiceSpec, ResourceError, parse_resource
from .status import condition, set_condition
from .traffic import NoTraffic

log = logging.getLogger("mindmotor.operator")

MANAGER = "mindmotor-operator"
SERVICE_ANNOTATION = "serving.mindmotor.io/inferenceservice"
NPU_ANNOTATION = "serving.mindmotor.io/npu"


class ServiceReconciler:
    def __init__(self, api: KubeAPI, image: str, controller: str, traffic=None,
                 checkpoint_claim: str | None = None, checkpoint_mount: str = "/checkpoints",
                 clock: Callable[[], float] = time.time):
        self.api = api
        self.image = image
        self.controller = controller               # what the worker pods register with
        self.traffic = traffic or NoTraffic()
        self.checkpoint_claim = checkpoint_claim
        self.checkpoint_mount = checkpoint_mount
        self.clock = clock
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._deleted: set[str] = set()            # uids whose versions `delete` removed: never again

    def _lock(self, namespace: str, name: str) -> asyncio.Lock:
        return self._locks.setdefault((namespace, name), asyncio.Lock())

    def backend(self, namespace: str, name: str, uid: str, spec: InferenceServiceSpec | None) -> KubernetesBackend:
        owner = {"apiVersion": API_VERSION, "kind": KIND, "name": name, "uid": uid, "controller": True,
                 "blockOwnerDeletion": True}
        annotations = {SERVICE_ANNOTATION: name}
        if spec is not None and spec.resources.npu is not None:
            annotations[NPU_ANNOTATION] = str(spec.resources.npu)
        image = (spec.runtime.image if spec is not None else "") or self.image
        return KubernetesBackend(self.api, namespace, image, self.controller, self.checkpoint_claim,
                                 self.checkpoint_mount, manager=MANAGER, owner=owner, pod_annotations=annotations)

    # ---- a pass -----------------------------------------------------------------------------
    async def reconcile(self, namespace: str, name: str, uid: str, generation: int, raw_spec: Any,
                        status: dict[str, Any] | None) -> dict[str, Any]:
        """Bring what runs toward the spec; the new status."""
        async with self._lock(namespace, name):
            if uid in self._deleted:               # a pass that waited for the lock while `delete` ran
                return dict(status or {})
            return await self._reconcile(namespace, name, uid, generation, raw_spec, dict(status or {}))

    async def _reconcile(self, namespace, name, uid, generation, raw_spec, status) -> dict[str, Any]:
        now = self.clock()
        conditions = list(status.get("conditions") or [])
        try:
            spec = parse_resource(raw_spec)
            spec.deployment_spec(name, canary_ready=False)          # the Deployer's own checks
        except ResourceError as exc:
            message = " ".join(str(exc).split())
            log.warning("invalid InferenceService", extra={"namespace": namespace, "service": name, "error": message})
            conditions = set_condition(conditions, ServiceCondition.READY, False, ServiceReason.INVALID_SPEC,
                                       message, generation, now)
            return {"observedGeneration": generation, "conditions": conditions}

        backend = self.backend(namespace, name, uid, spec)
        try:
            replicas = [r for r in await backend.observe() if r.deployment == name]
            slots, ready = _counts(replicas)
            canary_ready = spec.canary is not None and ready[spec.canary.version] >= spec.canary_replicas()
            wanted = spec.deployment_spec(name, canary_ready)
            changed = generation != status.get("observedGeneration")
            for version in wanted.versions:
                if changed or slots[version.name] != version.replicas:
                    await backend.scale(VersionTarget(wanted, version), version.replicas)
            slots, ready = _counts([r for r in await backend.observe() if r.deployment == name])
            leftovers = sorted(set(slots) - set(wanted.version_names()))
            serving_ready = ready[spec.version] >= spec.replicas
            weights = dict(wanted.traffic)
            if leftovers and not serving_ready:                     # make before break
                weights = {**{v: 0.0 for v in weights}, **{v: round(100.0 / len(leftovers), 6) for v in leftovers}}
            routed = await self.traffic.sync(name, spec.model, weights)
            if leftovers and serving_ready:
                for version in leftovers:
                    await backend.remove(name, version)
                    log.info("removed a version", extra={"namespace": namespace, "service": name, "version": version})
                slots, ready = _counts([r for r in await backend.observe() if r.deployment == name])
        except KubeAPIError as exc:
            log.warning("applying failed", extra={"namespace": namespace, "service": name, "error": str(exc)})
            conditions = set_condition(conditions, ServiceCondition.READY, False, ServiceReason.APPLY_FAILED,
                                       str(exc), generation, now)
            return {"conditions": conditions}
        return self._status(spec, name, generation, status, conditions, slots, ready, weights, canary_ready,
                            leftovers, routed, now)

    def _status(self, spec: InferenceServiceSpec, name, generation, old, conditions, slots, ready, weights,
                canary_ready, leftovers, routed, now) -> dict[str, Any]:
        versions = [{"name": v, "desired": slots.get(v, 0), "ready": ready.get(v, 0), "weight": weights.get(v, 0.0)}
                    for v in [*spec.version_names(), *sorted(set(slots) - set(spec.version_names()))]]
        serving = f"{ready[spec.version]} of {spec.replicas} replica(s) of {spec.version} ready"
        all_ready = ready[spec.version] >= spec.replicas and slots.get(spec.version, 0) == spec.replicas
        conditions = set_condition(conditions, ServiceCondition.READY, all_ready,
                                   ServiceReason.ALL_REPLICAS_READY if all_ready else ServiceReason.REPLICAS_NOT_READY,
                                   serving, generation, now)
        gone = sorted(set(slots) - set(spec.version_names()))
        if gone:
            progressing = (True, ServiceReason.DRAINING, f"removing {', '.join(gone)} once {spec.version} is ready")
        elif not all_ready or (spec.canary is not None and not canary_ready):
            progressing = (True, ServiceReason.SCALING, serving)
        else:
            progressing = (False, ServiceReason.STABLE, serving)
        conditions = set_condition(conditions, ServiceCondition.PROGRESSING, *progressing, generation, now)
        canary, previous = None, (old.get("canary") or {}).get("version")
        if spec.canary is not None:
            phase = ServiceReason.CANARY_SERVING if canary_ready else ServiceReason.CANARY_STARTING
            canary = {"version": spec.canary.version, "phase": str(phase)}
            message = (f"{spec.canary.version} takes {spec.canary.traffic}% of the traffic" if canary_ready else
                       f"{ready[spec.canary.version]} of {spec.canary_replicas()} replica(s) of "
                       f"{spec.canary.version} ready; no traffic until all are")
            conditions = set_condition(conditions, ServiceCondition.CANARY, True, phase, message, generation, now)
        elif previous:
            promoted = previous == spec.version
            reason = ServiceReason.PROMOTED if promoted else ServiceReason.ROLLED_BACK
            message = (f"{previous} was promoted: it takes all the traffic" if promoted else
                       f"canary {previous} was rolled back: {spec.version} takes all the traffic")
            log.info("canary " + ("promoted" if promoted else "rolled back"),
                     extra={"service": name, "version": previous, "serving": spec.version})
            conditions = set_condition(conditions, ServiceCondition.CANARY, False, reason, message, generation, now)
        elif condition({"conditions": conditions}, ServiceCondition.CANARY) is None:
            conditions = set_condition(conditions, ServiceCondition.CANARY, False, ServiceReason.NO_CANARY,
                                       "no canary", generation, now)
        conditions = set_condition(conditions, ServiceCondition.TRAFFIC_ROUTED, *routed, generation, now)
        return {
            "observedGeneration": generation,
            "replicas": slots.get(spec.version, 0),
            "readyReplicas": ready.get(spec.version, 0),
            "selector": label_selector(version_labels(name, spec.version, MANAGER)),
            "versions": versions,
            "traffic": weights,
            "canary": canary,
            "conditions": conditions,
        }

    # ---- deletion ---------------------------------------------------------------------------
    async def delete(self, namespace: str, name: str, uid: str) -> None:
        """Remove every version of the service and its traffic entry."""
        async with self._lock(namespace, name):
            backend = self.backend(namespace, name, uid, None)
            for version in sorted({r.version for r in await backend.observe() if r.deployment == name}):
                await backend.remove(name, version)
            await self.traffic.clear(name)
            self._deleted.add(uid)
            log.info("InferenceService deleted", extra={"namespace": namespace, "service": name})
        self._locks.pop((namespace, name), None)     # a pass still waiting on it finds the uid deleted


def _counts(replicas: list[Replica]) -> tuple[Counter, Counter]:
    """Per version: replica slots, and those ready."""
    slots = Counter(r.version for r in replicas)
    ready = Counter(r.version for r in replicas if r.phase == ReplicaPhase.RUNNING)
    return slots, ready
