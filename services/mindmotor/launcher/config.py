"""`PlatformConfig`: what `mindmotor up` starts — from its flags, `MINDMOTOR_*` environment variables
(`MINDMOTOR_PORT`, `MINDMOTOR_ADMIN_TOKEN`, ...) and a YAML file (common/settings.py); every key
optional.

```yaml
host: 127.0.0.1          # where every service listens
port: 8000               # the coordinator's HTTP port (the API and its /metrics); 0: a free one
coordinators: 2          # coordinator replicas, all serving `port` (one socket `up` holds: a replica that
                         # dies refuses no connection; it is restarted like any service)
ports:                   # 0: a free port, picked at the first start and kept across restarts
  controller: 0          # controller gRPC (workers, coordinator and deployer connect here)
  controller_admin: 0    # controller admin HTTP (/health, /metrics, /v1/instances)
  deployer: 0            # Deployer gRPC: `mindmotor deploy ... --deployer HOST:PORT`
  deployer_metrics: 0    # the deployer's /metrics
  metrics: 0             # `up`'s own /metrics (restarts of the services it supervises)
redis_url: null          # e.g. redis://127.0.0.1:6379/0: controller state, deployments, shared rate limits
                         # (better: $MINDMOTOR_REDIS_URL or redis_url_file)
api_keys: []             # empty: no auth (better: $MINDMOTOR_API_KEYS, comma-separated, or api_key_file)
admin_token: null        # bearer token of the controller's admin API and of the Deployer API
                         # (better: $MINDMOTOR_ADMIN_TOKEN or admin_token_file; secrets reach the services
                         # through their environment, never argv)
policy: least_load       # round_robin | weighted_round_robin | least_load | cache_aware
rate_limit_rpm: 0        # per key; 0: unlimited
log_dir: null            # default: a temporary directory (printed at start)
restart_backoff_s: 0.5   # a service or worker that died is started again after this, doubling ...
restart_backoff_max_s: 30  # ... with each death soon after its start, up to this
stable_after_s: 10       # a service that ran this long before it died starts the doubling afresh
liveness:                # a service alive but not answering (SIGSTOPped, stuck) is SIGKILLed and restarted
  enabled: true
  interval_s: 2          # between probes (coordinator /health, controller admin /health, deployer /metrics)
  timeout_s: 3           # one probe's HTTP timeout
  failures: 3            # probes in a row without an answer before the kill
models:                  # each is one deployment of the Deployer (version v1), its workers the replicas
  - path: null           # checkpoint directory; null: the bundled demo model
    name: null           # the deployment's name; null: from the model's directory name
    workers: 2
    device: 910B3
    emulate: null        # qwen2-7b | llama2-7b | llama3-70b (with tp) | null: the model itself
    tp: 1
    timing: realtime     # realtime | virtual
    roles: null          # one role per worker, e.g. [prefill, prefill, decode, decode] (sets
                         # `workers`); null: every worker mixed. The coordinator splits prefill
                         # and decode as soon as both roles are routable.
    node: null           # `--node` of every worker (KV over HCCS within a node); null: host name
    extra_args: []       # more `mindmotor worker` flags, e.g. ["--max-num-seqs", "64"]
controller_args: []      # more `mindmotor controller` flags, e.g. ["--pd-autoscale", "--pd-ttft-slo-ms", "500"]
deployer_args: []        # more `mindmotor deployer` flags, e.g. ["--rollout-timeout", "300"]
coordinator_args: []     # more `mindmotor coordinator` flags
```
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import NoDecode

from mindmotor.common.roles import NAMES, Role
from mindmotor.common.settings import ServiceSettings, split_list

from mindmotor.runtime.liveness import LivenessSettings


class ModelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str | None = None
    name: str | None = Field(None, pattern=r"^[a-z]([a-z0-9-]{0,22}[a-z0-9])?$")
    workers: int = Field(2, ge=1, le=64)
    device: str = "910B3"
    emulate: str | None = None
    tp: int = Field(1, ge=1)
    timing: str = Field("realtime", pattern="^(realtime|virtual)$")
    roles: list[str] | None = None
    node: str | None = None
    extra_args: list[str] = []

    @model_validator(mode="after")
    def _roles_match_workers(self) -> "ModelSpec":
        if self.roles is None:
            return self
        unknown = [r for r in self.roles if r not in NAMES]
        if unknown or not self.roles:
            raise ValueError(f"roles must be a non-empty list of {', '.join(NAMES)}; got {self.roles}")
        if "workers" in self.model_fields_set and self.workers != len(self.roles):
            raise ValueError(f"workers ({self.workers}) and roles ({len(self.roles)}) disagree; give one role per worker")
        self.workers = len(self.roles)
        return self

    def role_of(self, worker: int) -> str:
        return self.roles[worker] if self.roles else Role.MIXED.value


Port = Field(0, ge=0, le=65535)


class Ports(BaseModel):
    model_config = ConfigDict(extra="forbid")

    controller: int = Port
    controller_admin: int = Port
    deployer: int = Port
    deployer_metrics: int = Port
    metrics: int = Port


class PlatformConfig(ServiceSettings):
    secrets: ClassVar = {"admin_token": "admin token", "redis_url": "Redis URL"}

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    coordinators: int = Field(2, ge=1, le=64)
    ports: Ports = Field(default_factory=Ports)
    redis_url: str | None = None
    redis_url_file: str | None = None
    redis_prefix: str = "mindmotor:"
    policy: str = "least_load"
    api_keys: Annotated[list[str], NoDecode] = []
    api_key_file: str | None = None                  # one key a line, read at start
    admin_token: str | None = None
    admin_token_file: str | None = None
    rate_limit_rpm: float = Field(0.0, ge=0)
    log_dir: str | None = None
    ready_timeout_s: float = Field(120.0, gt=0)
    restart_backoff_s: float = Field(0.5, gt=0)
    restart_backoff_max_s: float = Field(30.0, gt=0)
    stable_after_s: float = Field(10.0, ge=0)
    liveness: LivenessSettings = Field(default_factory=LivenessSettings)
    controller_args: list[str] = []
    deployer_args: list[str] = []
    coordinator_args: list[str] = []
    models: list[ModelSpec] = Field(default_factory=lambda: [ModelSpec()], min_length=1)

    @field_validator("api_keys", mode="before")
    @classmethod
    def _api_key_list(cls, value: Any) -> Any:
        return split_list(value)

    @model_validator(mode="after")
    def _api_keys(self) -> "PlatformConfig":
        from mindmotor.common.secrets import secret_list

        self.api_keys = secret_list("API keys", self.api_keys, self.api_key_file)   # registered for redaction
        return self
