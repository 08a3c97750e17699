"""Where replicas run: `local` (child processes of the deployer) or `kubernetes` (a Deployment per
version and role, through the Kubernetes API). See `base.Backend` for what the reconcile loop asks
of them."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..config import DeployerConfig
from .base import Backend, Replica, VersionTarget

__all__ = ["Backend", "Replica", "VersionTarget", "make_backend"]


def make_backend(config: DeployerConfig) -> Backend:
    if config.backend == "kubernetes":
        from .kube_api import KubeHTTPAPI
        from .kubernetes import KubernetesBackend

        k8s = config.kubernetes
        return KubernetesBackend(KubeHTTPAPI.in_cluster(k8s.api_server), k8s.namespace, k8s.image,
                                 k8s.controller or config.controllers, k8s.checkpoint_claim, k8s.checkpoint_mount)
    from .local import LocalBackend

    log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="mindmotor-deployer-"))
    return LocalBackend(config.controllers, log_dir, host=config.worker_host, drain_timeout_s=config.drain_timeout_s)
