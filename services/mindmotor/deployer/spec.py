"""`DeploymentSpec`: what a deployment should run, from a YAML or JSON file.

```yaml
name: demo                      # [a-z][a-z0-9-], at most 24 characters (Kubernetes names)
model: mindmotor-demo           # the served model name requests ask for
versions:
  - name: v1                    # [a-z0-9][a-z0-9-], at most 24 characters
    checkpoint: /ckpt/step-400  # a Hugging Face checkpoint directory; omitted: the bundled model
    replicas: 2                 # default 1; 0 keeps the version without running it
    prefill: 0                  # replicas started as prefill instances (the first ones) ...
    decode: 0                   # ... then decode instances; the rest are mixed
    worker:                     # `mindmotor worker` flags by name (see worker_settings.py)
      device: 910B3
      emulate: qwen2-7b
      timing: realtime
    resources: {cpu: "2", memory: 4Gi}   # Kubernetes only
traffic: {v1: 100}              # version -> weight; omitted: every version equally
adapter_traffic:                # LoRA adapter -> its own split (omitted: the adapter follows `traffic`)
  sql: {v1: 90, v2: 10}         # (a rollout with --adapter sets and clears this itself)
```

Validation is structural here (`parse_spec`, `load_spec`: unknown fields, bad names, negative
counts, traffic naming unknown versions or summing to nothing); whether a checkpoint exists and
verifies is `verify_checkpoint`, run where the replicas will run (the deployer), with the model's
own checks (`resolve_model_dir`: the manifest's sha256 of every file; `LlamaConfig.from_dir`).
Errors are `SpecError`, one line per problem, each naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from .worker_settings import normalize_worker_settings

from mindmotor.common.roles import Role

NAME_PATTERN = r"^[a-z]([a-z0-9-]{0,22}[a-z0-9])?$"
VERSION_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,22}[a-z0-9])?$"
RESOURCE_KEYS = ("cpu", "memory")


class SpecError(ValueError):
    """A spec that cannot be deployed; the message names each bad field."""


class VersionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=VERSION_PATTERN)
    checkpoint: str = ""                               # "": the bundled demo model
    replicas: int = Field(1, ge=0, le=256)
    prefill: int = Field(0, ge=0)
    decode: int = Field(0, ge=0)
    worker: dict[str, str] = {}
    resources: dict[str, str] = {}

    @field_validator("checkpoint", mode="before")
    @classmethod
    def _checkpoint(cls, value: Any) -> Any:
        return "" if value is None else value

    @field_validator("worker", mode="before")
    @classmethod
    def _worker(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ValueError("a mapping of `mindmotor worker` settings")
        return normalize_worker_settings(value)

    @field_validator("resources", mode="before")
    @classmethod
    def _resources(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, dict) or set(value) - set(RESOURCE_KEYS):
            raise ValueError(f"a mapping with the keys {', '.join(RESOURCE_KEYS)}")
        return {k: str(v) for k, v in value.items()}

    @model_validator(mode="after")
    def _roles_fit(self) -> "VersionSpec":
        if self.prefill + self.decode > self.replicas:
            raise ValueError(f"prefill ({self.prefill}) + decode ({self.decode}) exceed replicas ({self.replicas})")
        return self

    def role_of(self, slot: int) -> str:
        """The role of replica number `slot`: prefill ones first, then decode, then mixed."""
        if slot < self.prefill:
            return Role.PREFILL.value
        if slot < self.prefill + self.decode:
            return Role.DECODE.value
        return Role.MIXED.value

    def template(self) -> dict[str, Any]:
        """What a running version is made of; it cannot change once the version exists."""
        return {"checkpoint": self.checkpoint, "prefill": self.prefill, "decode": self.decode,
                "worker": self.worker, "resources": self.resources}


class DeploymentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN)
    model: str = Field(min_length=1, max_length=200)
    versions: list[VersionSpec] = Field(min_length=1)
    traffic: dict[str, float] = {}
    adapter_traffic: dict[str, dict[str, float]] = {}

    @model_validator(mode="before")
    @classmethod
    def _default_traffic(cls, data: Any) -> Any:
        """No traffic given: every version the same weight."""
        if isinstance(data, dict) and not data.get("traffic") and isinstance(data.get("versions"), list):
            names = [v.get("name") for v in data["versions"] if isinstance(v, dict)]
            data = {**data, "traffic": {n: 1.0 for n in names if isinstance(n, str)}}
        return data

    @field_validator("versions")
    @classmethod
    def _unique(cls, versions: list[VersionSpec]) -> list[VersionSpec]:
        names = [v.name for v in versions]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"version names must be unique; repeated: {', '.join(duplicates)}")
        return versions

    @field_validator("traffic")
    @classmethod
    def _traffic(cls, traffic: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        if "versions" in info.data:                   # else the versions' own errors say enough
            check_traffic(traffic, [v.name for v in info.data["versions"]])
        return traffic

    @field_validator("adapter_traffic")
    @classmethod
    def _adapter_traffic(cls, adapters: dict[str, dict[str, float]], info: ValidationInfo) -> dict[str, dict[str, float]]:
        for adapter, weights in adapters.items():
            check_adapter_name(adapter)
            if "versions" in info.data:
                try:
                    check_traffic(weights, [v.name for v in info.data["versions"]])
                except ValueError as exc:
                    raise ValueError(f"{adapter}: {exc}") from None
        return adapters

    def version(self, name: str) -> VersionSpec | None:
        return next((v for v in self.versions if v.name == name), None)

    def version_names(self) -> list[str]:
        return [v.name for v in self.versions]

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def check_traffic(traffic: dict[str, float], versions: list[str]) -> None:
    """ValueError unless `traffic` names only `versions`, with weights >= 0 and a positive sum."""
    unknown = sorted(set(traffic) - set(versions))
    if unknown:
        raise ValueError(f"names unknown versions {', '.join(unknown)} (versions: {', '.join(versions)})")
    negative = sorted(v for v, w in traffic.items() if w < 0)
    if negative:
        raise ValueError(f"weights must be at least 0; negative for {', '.join(negative)}")
    if not sum(traffic.values()) > 0:
        raise ValueError("weights must sum to more than 0")


def check_adapter_name(name: str) -> None:
    """ValueError unless `name` can name a LoRA adapter (what `--lora-modules NAME=PATH` takes)."""
    if not name or len(name) > 200 or any(c.isspace() or c in "=,@" for c in name):
        raise ValueError(f"not a LoRA adapter name (1 to 200 characters, no spaces, '=', ',' or '@'): {name!r}")


def parse_spec(data: Any, source: str = "spec") -> DeploymentSpec:
    """The spec from parsed YAML/JSON; SpecError with one line per problem."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: the top level must be a mapping (name, model, versions, traffic)")
    try:
        return DeploymentSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{source}: invalid deployment spec:\n{describe_errors(exc)}") from None


def load_spec(path: str | Path) -> DeploymentSpec:
    """A spec file (YAML, or JSON — YAML reads both). Relative checkpoint paths are taken relative
    to the file's directory, so a spec means the same whoever applies it."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML/JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("versions"), list):
        data = {**data, "versions": [_anchor_checkpoint(v, path.parent) for v in data["versions"]]}
    return parse_spec(data, str(path))


def _anchor_checkpoint(version: Any, base: Path) -> Any:
    if isinstance(version, dict) and isinstance(version.get("checkpoint"), str) and version["checkpoint"]:
        checkpoint = Path(version["checkpoint"]).expanduser()
        return {**version, "checkpoint": str(checkpoint if checkpoint.is_absolute() else (base / checkpoint).resolve())}
    return version


def describe_errors(exc: ValidationError) -> str:
    """pydantic's errors as `  versions[1].replicas: Input should be greater than or equal to 0 (got -1)`."""
    lines = []
    for error in exc.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]).lstrip(".") or "spec"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown field"
        elif error["type"] == "string_pattern_mismatch":
            message = f"must match {error['ctx']['pattern']}"
        got = "" if error["type"] in ("missing", "value_error") else f" (got {json.dumps(error.get('input'), default=str)})"
        lines.append(f"  {where}: {message}{got}")
    return "\n".join(lines)


def verify_checkpoint(checkpoint: str) -> Path:
    """The checkpoint directory, verified: it exists, its manifest (if it has one) matches every
    file, and its config.json is a Llama-architecture config. CheckpointError otherwise."""
    from mindmotor.model.checkpoint import resolve_model_dir
    from mindmotor.model.config import LlamaConfig

    directory = resolve_model_dir(checkpoint or None)
    LlamaConfig.from_dir(directory)
    return directory.resolve()


def tokenizer_files(checkpoint: str):
    """The checkpoint's tokenizer files (`TokenizerFiles`: tokenizer.json, tokenizer_config.json);
    "" is the bundled model. CheckpointError if it has none."""
    from mindmotor.common.tokenizer import TokenizerError, TokenizerFiles
    from mindmotor.model.checkpoint import resolve_model_dir
    from mindmotor.model.config import CheckpointError

    try:
        return TokenizerFiles.read(resolve_model_dir(checkpoint or None))
    except TokenizerError as exc:
        raise CheckpointError(str(exc)) from None


def tokenizer_difference(serving: str, serving_files, new: str, new_files) -> str | None:
    """None if two versions tokenize alike (the same digest), else a sentence naming the version
    that serves, the new one, what differs and both digests."""
    if serving_files.digest() == new_files.digest():
        return None
    parts = []
    if serving_files.tokenizer_json != new_files.tokenizer_json:
        parts.append("the tokenizer (tokenizer.json)")
    if serving_files.tokenizer_config_json != new_files.tokenizer_config_json:
        parts.append("the chat template / special tokens (tokenizer_config.json)")
    return (f"{new}'s checkpoint has another tokenizer than {serving}, which serves: {' and '.join(parts)} "
            f"differ (tokenizer digest of {serving}: {serving_files.digest()}, of {new}: {new_files.digest()})")
