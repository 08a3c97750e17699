"""`WorkerConfig`: where a worker listens, who it is, how long it drains; plus its engine's config."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from mindmotor.common.roles import NAMES, Role
from mindmotor.engine.config import EngineConfig

READY_PREFIX = "MINDMOTOR_WORKER_READY"


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = "0.0.0.0"
    port: int = 50051                 # gRPC; 0: pick a free port (see the ready line)
    metrics_port: int = 0             # Prometheus /metrics; 0: pick a free port
    worker_id: str = field(default_factory=default_worker_id)
    drain_timeout_s: float = 30.0     # SIGTERM: longest wait for in-flight requests
    role: str = Role.MIXED.value      # "mixed" | "prefill" | "decode" (changeable: SetRole)
    node: str = field(default_factory=socket.gethostname)  # same node: KV moves over HCCS
    kv_pull_timeout_s: float = 5.0    # decode side: longest KV pull before prefilling locally
    role_drain_timeout_s: float = 30.0  # a role switch waits this long for in-flight requests
    max_concurrent_requests: int = 4096  # Generate/Prefill calls served at once; more: RESOURCE_EXHAUSTED
    stream_keepalive_s: float = 1.0   # a Generate stream silent this long gets a keepalive message; 0: never
    engine_stall_timeout_s: float = 10.0  # no keepalives once the engine thread has not gone round its
                                          # loop for this long (stuck in a step)
    controller: str | None = None     # "host:port[,host:port...]": register and heartbeat there
    advertise_address: str | None = None  # the address others should dial (default: host:port)
    served_model_name: str | None = None  # the model name served (Status, ModelInfo, registration);
                                          # None: the checkpoint directory's name
    deployment: str = ""              # for canary / A-B traffic splits
    version: str = ""
    weight: int = 1
    resume_retention_s: float = 60.0  # a call's output is kept this long after it ended (Recall); 0: not kept
    spec_helpers: int = 1             # helper processes that check structured-output specs (mindmotor.sandbox)
    spec_timeout_s: float = 3.0       # one spec's compile in a helper; longer: INVALID_ARGUMENT (below the
                                      # coordinator's stream progress deadline: no keepalives while checked)

    def __post_init__(self):
        if not 0 <= self.port <= 65535 or not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"ports must be in [0, 65535], got {self.port} and {self.metrics_port}")
        if self.role not in NAMES:
            raise ValueError(f"role must be one of mixed, prefill, decode, got {self.role!r}")
        if self.kv_pull_timeout_s <= 0:
            raise ValueError(f"the KV pull timeout must be positive, got {self.kv_pull_timeout_s}")
        if self.max_concurrent_requests < 1:
            raise ValueError(f"max_concurrent_requests must be at least 1, got {self.max_concurrent_requests}")
        if self.resume_retention_s < 0:
            raise ValueError(f"resume_retention_s must be at least 0, got {self.resume_retention_s}")
        if self.spec_helpers < 1 or self.spec_timeout_s <= 0:
            raise ValueError(f"spec_helpers must be at least 1 and spec_timeout_s positive, got "
                             f"{self.spec_helpers} and {self.spec_timeout_s}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain timeout must be at least 0, got {self.drain_timeout_s}")
        if self.stream_keepalive_s < 0:
            raise ValueError(f"the stream keepalive interval must be at least 0, got {self.stream_keepalive_s}")
        if self.engine_stall_timeout_s <= 0:
            raise ValueError(f"the engine stall timeout must be positive, got {self.engine_stall_timeout_s}")


def ready_line(port: int, metrics_port: int) -> str:
    """The one line a worker prints on stdout when it serves (launchers and tests wait for it)."""
    return f"{READY_PREFIX} port={port} metrics_port={metrics_port}"
