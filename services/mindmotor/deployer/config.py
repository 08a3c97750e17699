"""`DeployerConfig`: where the deployer listens, which controller its replicas join, which backend
runs them, where its state lives, and its timings."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from mindmotor.common.store import DEFAULT_PREFIX

from .analysis import AnalysisSettings

READY_PREFIX = "MINDMOTOR_DEPLOYER_READY"
OWNER_LEASE = "owner"          # under the store prefix: the deployer that acts on its deployments
BACKENDS = ("local", "kubernetes")


@dataclass(frozen=True)
class KubernetesSettings:
    """How the kubernetes backend renders a version (see backends/manifests.py)."""

    namespace: str = "default"
    image: str = "mindmotor:latest"
    controller: str | None = None          # the controller as pods reach it (default: --controller)
    checkpoint_claim: str | None = None    # a PersistentVolumeClaim mounted read-only at checkpoint_mount
    checkpoint_mount: str = "/checkpoints"
    api_server: str | None = None          # default: the in-cluster API (KUBERNETES_SERVICE_HOST)


def default_deployer_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class DeployerConfig:
    controllers: str                       # "host:port[,host:port]": replicas register there
    host: str = "0.0.0.0"
    port: int = 50070                      # gRPC; 0: pick a free port (see the ready line)
    metrics_port: int = 0                  # Prometheus /metrics; 0: pick a free port
    backend: str = "local"
    redis_url: str | None = None           # None: in-memory store (deployments die with the process)
    redis_prefix: str = DEFAULT_PREFIX     # the deployer's keys live under <prefix>deployer:
    admin_token: str | None = None         # None: the Deployer API is open (a warning is logged)
    allow_open: bool = False               # --allow-open-admin: open beyond loopback on purpose
    controller_token: str | None = None    # the controller's admin token (SetTraffic); None: admin_token
    reconcile_interval_s: float = 1.0
    rollout_timeout_s: float = 120.0       # a rollout's replicas must all be ready within this
    drain_timeout_s: float = 30.0          # local replicas: SIGTERM, then SIGKILL after this (+5 s)
    orphan_grace_s: float = 30.0         # after a store reset: replicas no record names are kept this long
    restart_initial_s: float = 0.5         # crashed replicas: first restart delay, doubling ...
    restart_max_s: float = 30.0            # ... up to this
    lease_ttl_s: float = 2.0               # the owner lease; a standby takes over within 2 × this
    deployer_id: str = field(default_factory=default_deployer_id)   # the lease holder's name
    worker_host: str = "127.0.0.1"         # local replicas listen (and are reached) here
    log_dir: Path | None = None            # local replicas' logs; None: a temporary directory
    worker_ca_cert: str | None = None      # local replicas under mutual TLS: the worker CA (certificate ...
    worker_ca_key: str | None = None       # ... and key) that issues each its own certificate
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)
    coordinators: tuple[str, ...] = ()     # coordinator base URLs whose /metrics canary analysis reads
    analysis: AnalysisSettings = field(default_factory=AnalysisSettings)   # defaults for every rollout

    def __post_init__(self):
        for name in ("port", "metrics_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ValueError(f"{name} must be in [0, 65535], got {getattr(self, name)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        for name in ("reconcile_interval_s", "rollout_timeout_s", "restart_initial_s", "restart_max_s", "lease_ttl_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for url in self.coordinators:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"a coordinator is an http(s):// URL (its /metrics is read), got {url!r}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain timeout must be at least 0, got {self.drain_timeout_s}")

    @property
    def analysis_defaults(self) -> AnalysisSettings:
        """The analysis every rollout gets unless it says otherwise: off without coordinators."""
        from dataclasses import replace

        return replace(self.analysis, enabled=self.analysis.enabled and bool(self.coordinators))

    @property
    def store_prefix(self) -> str:
        return f"{self.redis_prefix}deployer:"

    @property
    def store_kind(self) -> str:
        return "redis" if self.redis_url else "memory"

    @property
    def traffic_token(self) -> str | None:
        return self.controller_token or self.admin_token


def ready_line(port: int, metrics_port: int) -> str:
    """The one line the deployer prints on stdout when it serves (launchers and tests wait for it)."""
    return f"{READY_PREFIX} port={port} metrics_port={metrics_port}"
