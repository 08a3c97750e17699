"""`PlatformConfig`: what `mindmotor up` starts — from its flags, `MINDMOTOR_*` environment variables
(`MINDMOTOR_PORT`, `MINDMOTOR_ADMIN_TOKEN`, ...) and a YAML file (common/settings.py); every key
optional.

Every key, with its default and what it does: `examples/platform.yaml` (a test keeps it complete
and loadable); the table: docs/operations.md.
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
    served_model_name: str | None = Field(None, min_length=1, max_length=256)   # None: the checkpoint's directory name
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
    state_dir: str | None = None                     # None: $XDG_DATA_HOME/mindmotor (common/up_state.py)
    log_dir: str | None = None                       # None: <state_dir>/logs
    ready_timeout_s: float = Field(120.0, gt=0)
    restart_backoff_s: float = Field(0.5, gt=0)
    restart_backoff_max_s: float = Field(30.0, gt=0)
    stable_after_s: float = Field(10.0, ge=0)
    liveness: LivenessSettings = Field(default_factory=LivenessSettings)
    controller_args: list[str] = []
    deployer_args: list[str] = []
    coordinator_args: list[str] = []
    model_repository: str | None = None              # a Triton model repository: its models replace `models`
    models: list[ModelSpec] = Field(default_factory=lambda: [ModelSpec()], min_length=1)

    @field_validator("api_keys", mode="before")
    @classmethod
    def _api_key_list(cls, value: Any) -> Any:
        return split_list(value)

    @model_validator(mode="after")
    def _model_repository(self) -> "PlatformConfig":
        """A Triton model repository's models (launcher/model_repository.py) replace `models`."""
        if self.model_repository is None:
            return self
        if "models" in self.model_fields_set:
            raise ValueError("give either model_repository or models, not both")
        from .model_repository import load_repository

        self.models = [ModelSpec.model_validate(spec) for spec in load_repository(self.model_repository)]
        return self

    @model_validator(mode="after")
    def _api_keys(self) -> "PlatformConfig":
        from mindmotor.common.secrets import secret_list

        self.api_keys = secret_list("API keys", self.api_keys, self.api_key_file)   # registered for redaction
        return self
