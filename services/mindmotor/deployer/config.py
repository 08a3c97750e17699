"""`DeployerConfig`: where the deployer listens, which controller its replicas join, which backend
runs them, where its state lives, and its timings — from flags, `MINDMOTOR_*` environment
variables and a YAML file (common/settings.py).

    controllers: 10.0.0.2:50050
    backend: kubernetes
    kubernetes: {namespace: serving, image: registry.example/mindmotor:1.4}
    coordinators: [http://10.0.0.3:8000]
    analysis: {max_error_rate_increase: 0.02, window_s: 120}
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from mindmotor.common.exposure import DEFAULT_HOST, require_admin_token
from mindmotor.common.settings import ServiceSettings, split_list
from mindmotor.common.store import DEFAULT_PREFIX

from .analysis import AnalysisSettings

READY_PREFIX = "MINDMOTOR_DEPLOYER_READY"
OWNER_LEASE = "owner"          # under the store prefix: the deployer that acts on its deployments
BACKENDS = ("local", "kubernetes")
Port = Field(ge=0, le=65535)


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


class DeployerConfig(ServiceSettings):
    secrets: ClassVar = {"admin_token": "admin token", "controller_token": "controller token",
                         "redis_url": "Redis URL"}

    controllers: str = ""                  # "host:port[,host:port]": replicas register there (required)
    host: str = DEFAULT_HOST               # beyond loopback it needs an admin token
    port: Annotated[int, Port] = 50070     # gRPC; 0: pick a free port (see the ready line)
    metrics_port: Annotated[int, Port] = 0  # Prometheus /metrics; 0: pick a free port
    backend: Literal["local", "kubernetes"] = "local"
    redis_url: str | None = None           # $MINDMOTOR_REDIS_URL or the file; none: in memory (deployments die
    redis_url_file: str | None = None      # with the process)
    redis_prefix: str = DEFAULT_PREFIX     # the deployer's keys live under <prefix>deployer:
    store_file: Path | None = None         # without Redis: deployments kept in this JSON file (one deployer;
                                           # `mindmotor up` gives <state dir>/deployer-store.json)
    admin_token: str | None = None         # $MINDMOTOR_ADMIN_TOKEN or the file; none: the Deployer API is open
    admin_token_file: str | None = None
    allow_open_admin: bool = False         # open beyond loopback on purpose
    controller_token: str | None = None    # the controller's admin token (SetTraffic); none: admin_token
    controller_token_file: str | None = None
    reconcile_interval_s: float = Field(1.0, gt=0)
    rollout_timeout_s: float = Field(120.0, gt=0)   # a rollout's replicas must all be ready within this
    drain_timeout_s: float = Field(30.0, ge=0)      # local replicas: SIGTERM, then SIGKILL after this (+5 s)
    orphan_grace_s: float = 30.0           # after a store reset: replicas no record names are kept this long
    restart_initial_s: float = Field(0.5, gt=0)     # crashed replicas: first restart delay, doubling ...
    restart_max_s: float = Field(30.0, gt=0)        # ... up to this
    lease_ttl_s: float = Field(2.0, gt=0)  # the owner lease; a standby takes over within 2 × this
    deployer_id: str = Field(default_factory=default_deployer_id)   # the lease holder's name
    worker_host: str = "127.0.0.1"         # local replicas listen (and are reached) here
    log_dir: Path | None = None            # local replicas' logs; None: a temporary directory
    worker_ca_cert: str | None = None      # local replicas under mutual TLS: the worker CA (certificate ...
    worker_ca_key: str | None = None       # ... and key) that issues each its own certificate
    kubernetes: KubernetesSettings = KubernetesSettings()
    coordinators: Annotated[tuple[str, ...], NoDecode] = ()   # coordinator base URLs whose /metrics canary
                                                                # analysis reads
    analysis: AnalysisSettings = AnalysisSettings()   # defaults for every rollout
    log_level: str = "INFO"

    @field_validator("coordinators", mode="before")
    @classmethod
    def _coordinators(cls, value: Any) -> Any:
        """A list, each item possibly comma-separated (`--coordinator URL[,URL]`)."""
        return [url.strip() for item in (split_list(value) or []) for url in str(item).split(",") if url.strip()]

    @field_validator("coordinators")
    @classmethod
    def _coordinator_urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"a coordinator is an http(s):// URL (its /metrics is read), got {url!r}")
        return value

    @model_validator(mode="after")
    def _check(self) -> "DeployerConfig":
        if not self.controllers.strip():
            raise ValueError("the controller replicas register with is required: --controller HOST:PORT "
                             "(or MINDMOTOR_CONTROLLERS, or `controllers:` in the --config file)")
        require_admin_token("the Deployer", self.host, self.admin_token, self.allow_open_admin)
        if self.redis_url and self.store_file:
            raise ValueError("give the deployer one store: a Redis URL or a store file, not both")
        return self

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
        return "redis" if self.redis_url else "file" if self.store_file else "memory"

    @property
    def store_url(self) -> str | None:
        """What `common.store.open_store` opens: the Redis URL, else the store file, else memory."""
        return self.redis_url or (f"file:{self.store_file}" if self.store_file else None)

    @property
    def traffic_token(self) -> str | None:
        return self.controller_token or self.admin_token


def ready_line(port: int, metrics_port: int) -> str:
    """The one line the deployer prints on stdout when it serves (launchers and tests wait for it)."""
    return f"{READY_PREFIX} port={port} metrics_port={metrics_port}"
