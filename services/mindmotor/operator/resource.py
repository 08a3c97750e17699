"""The `InferenceService` custom resource (`serving.mindmotor.io/v1`) as the operator reads it, and
what it means to the Deployer: a `DeploymentSpec` with the serving version and the canary.

```yaml
spec:
  model: qwen2-7b-chat             # served model name
  version: v1                      # the serving version's name
  checkpoint: /checkpoints/step-400   # "" or absent: the model bundled in the image
  replicas: 4
  runtime: {image: mindmotor:dev, device: 910B3, emulate: qwen2-7b, timing: realtime,
            worker: {max-num-seqs: "64"}}    # any other `mindmotor worker` flag, as text
  resources: {cpu: "2", memory: 8Gi, npu: 8} # npu: emulated cards per worker = `--tp`
  roles: {prefill: 1, decode: 1}   # the first replicas prefill, then decode, the rest mixed
  canary: {version: v2, checkpoint: /checkpoints/step-800, replicas: 1, traffic: 10}
```

The CRD's schema (deploy/kubernetes/operator/crd.yaml) is checked by the API server; this model
checks the same again (an operator may run against a cluster with an older CRD) and what a schema
cannot: worker settings against `mindmotor worker`'s own command line (through `VersionSpec`).
Errors are `ResourceError`, one line per problem, each naming the field.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mindmotor.deployer.spec import DeploymentSpec, SpecError, VERSION_PATTERN, describe_errors, parse_spec

GROUP = "serving.mindmotor.io"
VERSION = "v1"
PLURAL = "inferenceservices"
KIND = "InferenceService"
API_VERSION = f"{GROUP}/{VERSION}"
MAX_REPLICAS = 256


class ResourceError(ValueError):
    """An InferenceService that cannot be deployed; the message names each bad field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Runtime(_Strict):
    image: str = Field("", description="empty: the operator's --image")
    device: str = ""
    emulate: str = ""
    timing: str = Field("", pattern=r"^(realtime|virtual)?$")
    worker: dict[str, str] = {}


class Resources(_Strict):
    cpu: str | int | None = None
    memory: str | int | None = None
    npu: int | None = Field(None, ge=1, le=64)


class Roles(_Strict):
    prefill: int = Field(0, ge=0, le=MAX_REPLICAS)
    decode: int = Field(0, ge=0, le=MAX_REPLICAS)


class Canary(_Strict):
    version: str = Field(pattern=VERSION_PATTERN)
    checkpoint: str = ""
    replicas: int | None = Field(None, ge=1, le=MAX_REPLICAS)
    traffic: int = Field(ge=1, le=100)


class InferenceServiceSpec(_Strict):
    model: str = Field(min_length=1, max_length=200)
    version: str = Field(pattern=VERSION_PATTERN)
    checkpoint: str = ""
    replicas: int = Field(ge=0, le=MAX_REPLICAS)
    runtime: Runtime = Runtime()
    resources: Resources = Resources()
    roles: Roles = Roles()
    canary: Canary | None = None

    @field_validator("checkpoint", mode="before")
    @classmethod
    def _checkpoint(cls, value):
        return "" if value is None else value

    @model_validator(mode="after")
    def _consistent(self) -> "InferenceServiceSpec":
        if self.roles.prefill + self.roles.decode > self.replicas:
            raise ValueError(f"roles.prefill ({self.roles.prefill}) + roles.decode ({self.roles.decode}) "
                             f"exceed replicas ({self.replicas})")
        if self.canary is not None and self.canary.version == self.version:
            raise ValueError(f"canary.version: must differ from the serving version {self.version!r}")
        return self

    # ---- what the Deployer runs -------------------------------------------------------------
    def worker_settings(self) -> dict[str, str]:
        settings = dict(self.runtime.worker)
        for key in ("device", "emulate", "timing"):
            if getattr(self.runtime, key):
                settings[key] = getattr(self.runtime, key)
        if self.resources.npu is not None:
            settings["tp"] = str(self.resources.npu)
        return settings

    def pod_resources(self) -> dict[str, str]:
        return {k: str(v) for k, v in (("cpu", self.resources.cpu), ("memory", self.resources.memory)) if v is not None}

    def canary_replicas(self) -> int:
        if self.canary is None:
            return 0
        return self.canary.replicas or max(self.replicas, 1)

    def deployment_spec(self, name: str, canary_ready: bool) -> DeploymentSpec:
        """The Deployer's spec: the serving version, then the canary (same runtime and resources,
        its own checkpoint and replicas; the P/D split only if it fits). Traffic: all to the serving
        version, less the canary's percent once `canary_ready`."""
        common = {"worker": self.worker_settings(), "resources": self.pod_resources()}
        versions = [{"name": self.version, "checkpoint": self.checkpoint, "replicas": self.replicas,
                     "prefill": self.roles.prefill, "decode": self.roles.decode, **common}]
        traffic = {self.version: 100.0}
        if self.canary is not None:
            count = self.canary_replicas()
            fits = self.roles.prefill + self.roles.decode <= count
            versions.append({"name": self.canary.version, "checkpoint": self.canary.checkpoint, "replicas": count,
                             "prefill": self.roles.prefill if fits else 0, "decode": self.roles.decode if fits else 0,
                             **common})
            share = float(self.canary.traffic) if canary_ready else 0.0
            traffic = {self.version: 100.0 - share, self.canary.version: share}
            if share >= 100.0:
                traffic[self.version] = 0.0
        try:
            return parse_spec({"name": name, "model": self.model, "versions": versions, "traffic": traffic},
                              source="spec")
        except SpecError as exc:
            raise ResourceError(_in_resource_terms(str(exc))) from None

    def version_names(self) -> list[str]:
        return [self.version] + ([self.canary.version] if self.canary else [])


# A Deployer spec's field -> the InferenceService's (versions[0] is the serving version, [1] the canary)
FIELDS = {"name": "metadata.name", "model": "model", "worker": "runtime.worker", "resources": "resources",
          "checkpoint": "checkpoint", "replicas": "replicas", "prefill": "roles.prefill", "decode": "roles.decode"}
CANARY_OWN = frozenset({"checkpoint", "replicas"})       # fields a canary has of its own


def _in_resource_terms(message: str) -> str:
    """The Deployer's `SpecError` lines with the InferenceService's field names, each problem once
    (a runtime setting is refused for both versions)."""
    lines: list[str] = []
    for line in message.splitlines()[1:]:
        where, _, problem = line.strip().partition(": ")
        canary = where.startswith("versions[1].")
        field = where.split("].", 1)[1] if where.startswith("versions[") else where
        field = FIELDS.get(field, field)
        if canary and field in CANARY_OWN:
            field = f"canary.{field}"
        text = f"  {field}: {problem}"
        if text not in lines:
            lines.append(text)
    return "invalid InferenceService spec:\n" + "\n".join(lines or [f"  {message}"])


def parse_resource(spec: object) -> InferenceServiceSpec:
    """The spec of an InferenceService (its `.spec`, a mapping); ResourceError with one line per problem."""
    if not isinstance(spec, dict):
        raise ResourceError("spec: must be a mapping (model, version, replicas, ...)")
    try:
        return InferenceServiceSpec.model_validate(spec)
    except ValidationError as exc:
        raise ResourceError(f"invalid InferenceService spec:\n{describe_errors(exc)}") from None


__all__ = ["API_VERSION", "GROUP", "InferenceServiceSpec", "KIND", "PLURAL", "ResourceError", "VERSION",
           "parse_resource"]
