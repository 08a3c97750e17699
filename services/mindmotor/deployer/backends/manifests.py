"""The Kubernetes objects of one deployment version: a `Deployment` per role the version uses (all
of them for a version without prefill/decode counts: one, named `<deployment>-<version>`) and one
headless `Service` selecting every pod of the version (DNS and Prometheus discovery; coordinators
reach the pods through the controller's routing table, not through the Service).

Each pod runs `mindmotor worker` with the version's settings, registers with the controller as
`$(POD_NAME)` at `$(POD_IP):50051`, and is probed over the standard gRPC health service (the
worker reports NOT_SERVING while it drains, so a draining pod leaves the Service at once). The
grace period covers the worker's drain timeout.

Who manages the objects is in their `app.kubernetes.io/managed-by` label: `mindmotor-deployer` (the
Deployer) or `mindmotor-operator` (the InferenceService operator, which also sets an owner
reference to its InferenceService and per-pod annotations); each lists only its own, so a Deployer
and the operator in one namespace never remove each other's versions.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .base import VersionTarget
from .command import worker_args

from mindmotor.common.roles import Role

GRPC_PORT = 50051
METRICS_PORT = 9100
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
DEPLOYER = "mindmotor-deployer"
MANAGED_BY = {MANAGED_BY_LABEL: DEPLOYER}
DEPLOYMENT_LABEL = "mindmotor.io/deployment"
VERSION_LABEL = "mindmotor.io/version"
ROLE_LABEL = "mindmotor.io/role"
DRAIN_DEFAULT_S = 30.0
GRACE_MARGIN_S = 10


def managed_by(manager: str = DEPLOYER) -> dict[str, str]:
    return {MANAGED_BY_LABEL: manager}


def version_labels(deployment: str, version: str, manager: str = DEPLOYER) -> dict[str, str]:
    return {**managed_by(manager), DEPLOYMENT_LABEL: deployment, VERSION_LABEL: version}


def object_name(deployment: str, version: str, role: str = Role.MIXED) -> str:
    base = f"{deployment}-{version}"
    return base if role == Role.MIXED else f"{base}-{role}"


def role_counts(target: VersionTarget, replicas: int) -> dict[str, int]:
    """Replicas per role for `replicas` replicas (slot order: prefill, decode, mixed), with every
    role the version's full layout uses (a role scaled to zero keeps its Deployment at 0)."""
    version = target.version
    layout = {version.role_of(slot) for slot in range(max(version.replicas, 1))}
    counts = Counter(version.role_of(slot) for slot in range(replicas))
    return {role: counts.get(role, 0) for role in (Role.PREFILL, Role.DECODE, Role.MIXED) if role in layout}


def render_version(target: VersionTarget, replicas: int, namespace: str, image: str, controller: str,
                   checkpoint_claim: str | None = None, checkpoint_mount: str = "/checkpoints",
                   manager: str = DEPLOYER, owner: dict[str, Any] | None = None,
                   pod_annotations: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every object of the version at `replicas` replicas: its Deployments, then its Service.
    `owner`: an ownerReference every object carries (Kubernetes' garbage collector deletes them
    with their owner); `pod_annotations`: added to every pod template."""
    deployment, version = target.key
    objects = [_deployment(target, role, count, namespace, image, controller, checkpoint_claim, checkpoint_mount,
                           manager, pod_annotations or {})
               for role, count in role_counts(target, replicas).items()]
    objects.append(_service(deployment, version, namespace, manager))
    if owner is not None:
        for obj in objects:
            obj["metadata"]["ownerReferences"] = [dict(owner)]
    return objects


CLUSTER_SECRET = "mindmotor-cluster"


def _deployment(target: VersionTarget, role: str, replicas: int, namespace: str, image: str, controller: str,
                checkpoint_claim: str | None, checkpoint_mount: str, manager: str,
                pod_annotations: dict[str, str]) -> dict[str, Any]:
    deployment, version = target.key
    labels = {**version_labels(deployment, version, manager), ROLE_LABEL: role}
    drain_s = float(target.version.worker.get("drain_timeout", DRAIN_DEFAULT_S))
    container: dict[str, Any] = {
        "name": "worker",
        "image": image,
        "command": ["mindmotor"],
        "args": _args(target, role, controller),
        "env": [_field_env("POD_NAME", "metadata.name"), _field_env("POD_IP", "status.podIP"),
                _field_env("NODE_NAME", "spec.nodeName"),
                # the cluster token of deploy/kubernetes (docs/security.md): the pod binds beyond loopback
                {"name": "MINDMOTOR_CLUSTER_TOKEN",
                 "valueFrom": {"secretKeyRef": {"name": CLUSTER_SECRET, "key": "token"}}}],
        "ports": [{"name": "grpc", "containerPort": GRPC_PORT}, {"name": "metrics", "containerPort": METRICS_PORT}],
        "startupProbe": {"grpc": {"port": GRPC_PORT}, "periodSeconds": 5, "failureThreshold": 120},
        "readinessProbe": {"grpc": {"port": GRPC_PORT}, "periodSeconds": 5, "failureThreshold": 1},
        "livenessProbe": {"grpc": {"port": GRPC_PORT}, "periodSeconds": 10, "failureThreshold": 6},
    }
    if target.version.resources:
        container["resources"] = {"requests": dict(target.version.resources),
                                  "limits": dict(target.version.resources)}
    pod: dict[str, Any] = {"terminationGracePeriodSeconds": int(drain_s) + GRACE_MARGIN_S, "containers": [container]}
    if checkpoint_claim:
        container["volumeMounts"] = [{"name": "checkpoints", "mountPath": checkpoint_mount, "readOnly": True}]
        pod["volumes"] = [{"name": "checkpoints",
                           "persistentVolumeClaim": {"claimName": checkpoint_claim, "readOnly": True}}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": object_name(deployment, version, role), "namespace": namespace, "labels": labels,
                     "annotations": {"mindmotor.io/checkpoint": target.version.checkpoint or "bundled",
                                     "mindmotor.io/model": target.deployment.model}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels, **({"annotations": dict(pod_annotations)}
                                                                 if pod_annotations else {})},
                              "spec": pod}},
    }


def _args(target: VersionTarget, role: str, controller: str) -> list[str]:
    args = worker_args(target, role, controller, worker_id="$(POD_NAME)")
    args += ["--host", "0.0.0.0", "--port", str(GRPC_PORT), "--metrics-port", str(METRICS_PORT),
             "--advertise-address", f"$(POD_IP):{GRPC_PORT}"]
    if "node" not in target.version.worker:
        args += ["--node", "$(NODE_NAME)"]
    return args


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _service(deployment: str, version: str, namespace: str, manager: str) -> dict[str, Any]:
    labels = version_labels(deployment, version, manager)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": object_name(deployment, version), "namespace": namespace, "labels": labels},
        "spec": {"clusterIP": "None", "selector": labels,
                 "ports": [{"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc"},
                           {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"}]},
    }
