"""`PlatformConfig`: what `mindmotor up` starts, from a YAML file (all keys optional).

```yaml
host: 127.0.0.1          # where every service listens
port: 8000               # the coordinator's HTTP port (the API)
redis_url: null          # e.g. redis://127.0.0.1:6379/0: controller state and shared rate limits
policy: least_load       # round_robin | weighted_round_robin | least_load | cache_aware
api_keys: []             # empty: no auth
rate_limit_rpm: 0        # per key; 0: unlimited
log_dir: null            # default: a temporary directory (printed at start)
models:
  - path: null           # checkpoint directory; null: the bundled demo model
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
```
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

ROLES = ("mixed", "prefill", "decode")


class ModelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str | None = None
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
        unknown = [r for r in self.roles if r not in ROLES]
        if unknown or not self.roles:
            raise ValueError(f"roles must be a non-empty list of {', '.join(ROLES)}; got {self.roles}")
        if "workers" in self.model_fields_set and self.workers != len(self.roles):
            raise ValueError(f"workers ({self.workers}) and roles ({len(self.roles)}) disagree; give one role per worker")
        self.workers = len(self.roles)
        return self

    def role_of(self, worker: int) -> str:
        return self.roles[worker] if self.roles else "mixed"


class PlatformConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    redis_url: str | None = None
    redis_prefix: str = "mindmotor:"
    policy: str = "least_load"
    api_keys: list[str] = []
    rate_limit_rpm: float = Field(0.0, ge=0)
    log_dir: str | None = None
    ready_timeout_s: float = Field(120.0, gt=0)
    controller_args: list[str] = []
    models: list[ModelSpec] = Field(default_factory=lambda: [ModelSpec()])

    @classmethod
    def load(cls, path: str | Path | None, **overrides) -> "PlatformConfig":
        data = {}
        if path:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
            if not isinstance(loaded, dict):
                raise ValueError(f"{path}: the top level must be a mapping of settings")
            data.update(loaded)
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(data)
