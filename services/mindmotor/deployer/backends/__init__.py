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
    from mindmotor.common.rpc import security

    from .local import LocalBackend
    from .replica_identity import ReplicaIdentities

    log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="mindmotor-deployer-"))
    identities = ReplicaIdentities.from_settings(config.worker_ca_cert, config.worker_ca_key, security(), log_dir,
                                                 config.worker_host)
    return LocalBackend(config.controllers, log_dir, host=config.worker_host, drain_timeout_s=config.drain_timeout_s,
                        identities=identities)
