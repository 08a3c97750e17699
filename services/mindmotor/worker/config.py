"""`WorkerConfig`: where a worker listens, who it is, how long it drains, and its engine — from
flags, `MINDMOTOR_*` environment variables and a YAML file (common/settings.py).

    port: 50051
    controller: 10.0.0.2:50050
    role: prefill
    engine:                      # the engine's own settings (engine/config.py); keys not given keep
      model: /ckpt/qwen2-7b      # the worker's defaults; environment: MINDMOTOR_ENGINE__MAX_NUM_SEQS=64
      max_num_seqs: 64
      kv_host_budget_bytes: 2GiB
      kv_host_bytes: 8GiB        # the KV host tier (0: none); sizes as text

The engine's settings stay `EngineConfig`, the frozen dataclass the offline `LLM` takes too: the
worker validates a mapping into one, with its own defaults where they differ from the library's
(realtime timing, an automatic attention budget).
"""

from __future__ import annotations

import os
import socket
from typing import Annotated, Any, ClassVar

from pydantic import Field, field_validator, model_validator

from mindmotor.common.exposure import DEFAULT_HOST
from mindmotor.common.roles import Role
from mindmotor.common.settings import ServiceSettings
from mindmotor.engine.config import EngineConfig

READY_PREFIX = "MINDMOTOR_WORKER_READY"
Port = Field(ge=0, le=65535)
# Where `mindmotor worker` differs from the library's defaults: it serves in real time, and bounds a
# step's prefill attention by the served model's host cost (engine/step_budget.py).
# And it keeps a KV host tier (engine/kv_tier.py) of 5% of the machine's memory. With SLO classes
# (engine/scheduler.py, "Classes") no class waits more than 10 s for a start, and a batch-class
# prompt computes at most 256 tokens in a step beside more urgent work.
ENGINE_DEFAULTS = EngineConfig(timing="realtime", max_num_batched_attention=None, kv_host_bytes=None,
                               priority_aging_s=10.0, lower_class_prefill_tokens=256)


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class WorkerConfig(ServiceSettings):
    secrets: ClassVar[dict[str, str]] = {"redis_url": "Redis URL"}   # redis_url_file holds it, if given

    engine: EngineConfig = ENGINE_DEFAULTS
    host: str = DEFAULT_HOST
    port: Annotated[int, Port] = 50051               # gRPC; 0: pick a free port (see the ready line)
    metrics_port: Annotated[int, Port] = 0           # Prometheus /metrics; 0: pick a free port
    worker_id: str = Field(default_factory=default_worker_id)   # under mutual TLS: its certificate's name
    drain_timeout_s: float = Field(30.0, ge=0)       # SIGTERM: longest wait for in-flight requests
    role: Role = Role.MIXED                          # changeable: SetRole
    node: str = Field(default_factory=socket.gethostname)  # same node: KV moves over HCCS
    kv_pull_timeout_s: float = Field(5.0, gt=0)      # decode side: longest KV pull before prefilling locally
    role_drain_timeout_s: float = Field(30.0, ge=0)  # a role switch waits this long for in-flight requests
    max_concurrent_requests: int = Field(4096, ge=1)  # Generate/Prefill calls served at once; more: RESOURCE_EXHAUSTED
    stream_keepalive_s: float = Field(1.0, ge=0)     # a Generate stream silent this long gets a keepalive message;
                                                     # 0: never
    otlp_traces_endpoint: str | None = None          # OTLP/HTTP receiver of traces (vLLM's flag); None: off
    inject_delay: str | None = None                  # TESTS ONLY: "PHASE=SECONDS" added to every Generate call
                                                     # (INJECTABLE_PHASES); None: none
    engine_stall_timeout_s: float = Field(10.0, gt=0)  # no keepalives once the engine thread has not gone round
                                                       # its loop for this long (stuck in a step)
    controller: str | None = None                    # "host:port[,host:port...]": register and heartbeat there
    advertise_address: str | None = None             # the address others should dial (default: host:port)
    served_model_name: str | None = None             # the model name served (Status, ModelInfo, registration);
                                                     # None: the checkpoint directory's name
    deployment: str = ""                             # for canary / A-B traffic splits
    version: str = ""
    weight: int = 1
    resume_retention_s: float = Field(60.0, ge=0)    # a call's output is kept this long after it ended (Recall)
    spec_helpers: int = Field(1, ge=1)               # helper processes that check structured-output specs
    spec_timeout_s: float = Field(3.0, gt=0)         # one spec's compile in a helper; longer: INVALID_ARGUMENT
                                                     # (below the coordinator's stream progress deadline)
    log_level: str = "INFO"
    kv_shared: bool = False                          # share host-tier KV blocks through Redis (worker/kv_shared.py)
    kv_shared_ttl_s: float = Field(600.0, gt=0)      # a shared block's lifetime in Redis
    redis_url: str | None = None                     # the shared tier's Redis ($MINDMOTOR_REDIS_URL) ...
    redis_url_file: str | None = None                # ... or a file holding that URL

    @model_validator(mode="after")
    def _shared_tier(self) -> "WorkerConfig":
        if self.kv_shared and not self.redis_url:
            raise ValueError("kv_shared needs a Redis: set $MINDMOTOR_REDIS_URL or --redis-url-file")
        if self.kv_shared and (self.engine.kv_host_bytes == 0 or not self.engine.enable_prefix_caching):
            raise ValueError("kv_shared shares the KV host tier: it needs --kv-host-bytes above 0 and prefix caching")
        return self

    @field_validator("otlp_traces_endpoint")
    @classmethod
    def _otlp(cls, value: str | None) -> str | None:
        from mindmotor.common.tracing import check_endpoint

        return check_endpoint(value)

    @field_validator("inject_delay")
    @classmethod
    def _inject_delay(cls, value: str | None) -> str | None:
        parse_injected_delay(value)
        return value

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_text(cls, value: Any) -> Any:
        """Sizes as text ("2GiB", "25%") and "auto" where the flags take them."""
        if not isinstance(value, dict):
            return value
        value = dict(value)
        for key in ("kv_host_budget_bytes", "kv_host_bytes", "cache_chunk_size"):
            size = value.get(key)
            if isinstance(size, str) and not size.strip().isdigit():
                from mindmotor.engine.host_memory import parse_size

                value[key] = parse_size(size)
        if value.get("max_num_batched_attention") == "auto":
            value["max_num_batched_attention"] = None
        return value

    def given_worker_id(self) -> str | None:
        """The worker id as configured; None when it was left to the default."""
        return self.worker_id if "worker_id" in self.model_fields_set else None


# where `--inject-delay` can put time: the phases of `mindmotor analyze latency` (common/latency_phases.py)
# that the worker's Generate call spans — before the engine has the request (the worker's queue),
# and after its last token before the last message goes out (the network, to the coordinator)
INJECTABLE_PHASES = ("worker_queue", "network")


def parse_injected_delay(text: str | None) -> tuple[str, float] | None:
    """`"worker_queue=0.05"` → ("worker_queue", 0.05); ValueError naming what is wrong."""
    if not text:
        return None
    phase, equals, seconds = text.partition("=")
    try:
        value = float(seconds) if equals else -1.0
    except ValueError:
        value = -1.0
    if phase not in INJECTABLE_PHASES or not 0 <= value <= 60:
        raise ValueError(f"{text!r} is not PHASE=SECONDS, PHASE one of {', '.join(INJECTABLE_PHASES)}, "
                         "SECONDS from 0 to 60")
    return phase, value


def ready_line(port: int, metrics_port: int) -> str:
    """The one line a worker prints on stdout when it serves (launchers and tests wait for it)."""
    return f"{READY_PREFIX} port={port} metrics_port={metrics_port}"
