"""`CoordinatorSettings`: every setting of the coordinator, from (highest first) command-line flags,
`MINDMOTOR_*` environment variables, a YAML file (`--config`), then the defaults below.

    workers:                       # static instances (or `controllers:`, the routing table's)
      - 10.0.0.5:50051
      - {address: 10.0.0.6:50051, weight: 2, deployment: qwen, version: v2}
    models: {qwen2-7b: /ckpt/qwen2-7b}   # served name -> checkpoint dir (tokenizer, chat template);
                                         # optional: models without one are discovered from their workers
    policy: least_load
    traffic: {qwen2-7b: {v1: 90, v2: 10}}  # canary: 10% of the model's requests to version v2
    api_key_file: /run/secrets/api-keys  # or: one key a line (api_keys: [...] in a file is discouraged)
    https_cert: /etc/mindmotor/tls/tls.crt
    https_key: /etc/mindmotor/tls/tls.key

Secrets (API keys, a Redis URL with a password) belong in the environment (`MINDMOTOR_API_KEYS`,
`MINDMOTOR_REDIS_URL`) or in files (`api_key_file`, `redis_url_file`), not on the command line.
Environment lists are comma-separated (`MINDMOTOR_API_KEYS=sk-one,sk-two`,
`MINDMOTOR_WORKERS=10.0.0.5:50051,10.0.0.6:50051`) or JSON.
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import NoDecode

from mindmotor.common.settings import ServiceSettings, split_list
from mindmotor.coordinator.slo_classes import DEFAULT_CLASSES, SLOClass, check as check_classes

READY_PREFIX = "MINDMOTOR_COORDINATOR_READY"
POLICY_NAMES = ("round_robin", "weighted_round_robin", "least_load", "cache_aware")


class WorkerEntry(BaseModel):
    """One statically configured worker."""
    address: str
    weight: float = Field(1.0, ge=0)
    deployment: str = ""
    version: str = ""

    @classmethod
    def parse(cls, text: str) -> "WorkerEntry":
        """`ADDR` or `ADDR,weight=2,version=v2,deployment=qwen` (the `--worker` syntax)."""
        address, *options = [part.strip() for part in text.split(",")]
        fields: dict[str, Any] = {"address": address}
        for option in options:
            key, sep, value = option.partition("=")
            if not sep or key not in ("weight", "deployment", "version"):
                raise ValueError(f"bad worker option {option!r} in {text!r} "
                                 "(expected weight=W, version=V or deployment=D)")
            fields[key] = value
        return cls(**fields)


class CoordinatorSettings(ServiceSettings):
    """The coordinator's settings: flags > `MINDMOTOR_*` environment > the YAML file (`--config`) >
    the defaults below, as every service's (common/settings.py: unknown keys in the file refused)."""

    secrets: ClassVar[dict[str, str]] = {"redis_url": "Redis URL", "resume_key": "stream resume key",
                                         "admin_token": "admin token"}

    # serving
    host: str = "127.0.0.1"                          # standalone: loopback unless told otherwise
    port: int = Field(8000, ge=0, le=65535)          # 0: pick a free port (see the ready line)
    listen_fd: int | None = Field(None, ge=0)        # serve a listening socket inherited as this fd (replicas
                                                     # of `mindmotor up` share one); `host`/`port` unused
    replica_port: int | None = Field(None, ge=0, le=65535)  # also serve on this port of `host`, this process
                                                     # alone (probes, per-replica /health); 0: a free one
    coordinator_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-"
                                                        f"{uuid.uuid4().hex[:6]}")
    log_level: str = "INFO"

    # instances and models
    controllers: Annotated[list[str], NoDecode] = []  # controller addresses: the routing table from Watch
    workers: Annotated[list[WorkerEntry], NoDecode] = []   # ... or static workers
    models: dict[str, str] = {}                      # served model name -> checkpoint directory
    model_dir: str | None = None                     # tokenizer for a model without its own entry
    model_uris: dict[str, str] = {}                  # model -> its `root` in /v1/models (default: the name)
    status_interval_s: float = Field(1.0, gt=0)      # how often each worker's Status is read
    status_timeout_s: float = Field(1.0, gt=0)
    suspect_s: float = Field(5.0, ge=0)              # a worker that failed a request is skipped this long
    lora_poll_interval_s: float = Field(1.0, gt=0)   # how often each worker's LoRA adapters are listed
    admin_token: str | None = None                   # POST /v1/load_lora_adapter, /v1/unload_lora_adapter
    admin_token_file: str | None = None              # (Authorization: Bearer <admin token>); None: refused

    # models discovered from their workers (ModelInfo): those with no local checkpoint directory
    discovery_timeout_s: float = Field(10.0, gt=0)   # one ModelInfo call
    discovery_backoff_s: float = Field(0.5, gt=0)    # the wait before retrying a failed one; doubles ...
    discovery_backoff_max_s: float = Field(30.0, gt=0)  # ... up to this
    discovery_forget_s: float = Field(300.0, ge=0)   # a discovered model no instance serves is dropped after this

    # routing
    policy: str = "least_load"
    model_policies: dict[str, str] = {}              # model -> policy, overriding `policy`
    traffic: dict[str, dict[str, float]] = {}        # model -> version -> traffic weight
    cache_aware_max_blocks: int = Field(200_000, ge=1)        # remembered block hashes per instance
    cache_aware_balance_abs_tokens: int = Field(16384, ge=0)  # imbalance bound of cache_aware ...
    cache_aware_balance_rel: float = Field(1.5, ge=1.0)       # ... (both must be exceeded)

    # limits
    max_body_bytes: int = Field(1 << 20, ge=1)       # MindIE's 1 MB
    max_requests: int = Field(10000, ge=0)           # outstanding requests (choices) per model
    max_n: int = Field(128, ge=1)
    max_retry: int = Field(5, ge=0)                  # resubmissions of one request after failures
    prefill_timeout_s: float = Field(60.0, gt=0)     # P/D split: longest Prefill call before falling back
    stream_progress_timeout_s: float = Field(5.0, ge=0)  # a worker stream silent this long (no token, no
                                                     # keepalive) is given up and continued elsewhere; 0: never
    stream_first_message_timeout_s: float = Field(30.0, ge=0)  # ... before the call's first message
    failed_instance_silence_s: float = Field(2.0, gt=0)  # ... or silent this long while the routing table
                                                     # says its instance failed (gone, replaced, suspect)
    retry_after_s: int = Field(1, ge=0)              # the Retry-After of a full queue
    admission_wait_s: float = Field(0.0, ge=0)       # a request beyond its class's share waits this long for
                                                     # room (the most urgent class first) before 429; 0: never
    otlp_traces_endpoint: str | None = None          # OTLP/HTTP receiver of traces (vLLM's flag); None: off
    # SLO classes (slo_classes.py): name -> priority, max_share, ttft_s, tpot_s
    slo_classes: dict[str, SLOClass] = Field(default_factory=lambda: dict(DEFAULT_CLASSES))
    default_class: str = "standard"                  # the class of a request whose key has none
    class_by_key: dict[str, str] = {}                # an API key's SHA-256 (hex) -> its class
    max_tools: int = Field(128, ge=0)                # functions in one request's `tools` (OpenAI's limit)
    max_prompt_chars: int = Field(4 << 20, ge=1)     # a prompt's text, after the chat template
    responses_store_path: str | None = None          # /v1/responses: a SQLite file the replicas share; None: memory
    responses_ttl_s: float = Field(3600.0, gt=0)     # a stored response (previous_response_id, GET) lives this long
    responses_max: int = Field(1000, ge=1)           # stored responses; past it (or the bytes) the oldest go
    responses_max_bytes: int = Field(64 << 20, ge=1)  # their JSON's bytes

    # work a request carries, off the event loop (docs/architecture.md, "Nothing a request carries ...")
    spec_helpers: int = Field(2, ge=1)               # helper processes compiling structured-output specs
    spec_timeout_s: float = Field(3.0, gt=0)         # one spec's compile; longer: 400 (and the helper killed)
    spec_wait_s: float = Field(5.0, gt=0)            # wait for a free helper; longer: 429
    loop_lag_interval_s: float = Field(0.1, gt=0)    # how often the event loop's lag is sampled

    # HTTP connections (common/http_limits.py)
    http_header_timeout_s: float = Field(10.0, gt=0)  # request line + headers complete within this (else 408)
    http_body_timeout_s: float = Field(60.0, gt=0)   # the body complete within this after the headers (else 408)
    http_keep_alive_s: float = Field(30.0, gt=0)     # an idle kept-alive connection is closed after this
    http_max_connections: int = Field(4096, ge=0)    # open connections; beyond: 503 + Retry-After; 0: no limit
    http_max_header_bytes: int = Field(65536, ge=1024)  # request line + headers (else 400)
    http_backlog: int = Field(2048, ge=1)            # the listen backlog
    http_protocol: Literal["auto", "h11", "httptools"] = "auto"  # uvicorn's HTTP parser; auto: httptools
                                                     # where installed (uvicorn[standard]), else h11
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"   # auto: uvloop where installed
    access_log: bool = False                         # INFO line per sampled API request (all at DEBUG)
    access_log_sample: float = Field(1.0, gt=0, le=1)  # with access_log: the share of requests logged

    # auth and rate limit
    api_keys: Annotated[list[str], NoDecode] = []    # $MINDMOTOR_API_KEYS (comma-separated) ...
    api_key_file: str | None = None                  # ... and/or a file of keys, one a line (re-read on change)
    rate_limit_rpm: float = Field(0.0, ge=0)         # requests per minute per key; 0: unlimited
    rate_limit_burst: int | None = Field(None, ge=1)  # bucket size (default: one minute's worth)
    redis_url: str | None = None                     # shared rate limit across coordinators ...
    redis_url_file: str | None = None                # ... or a file holding that URL
    redis_prefix: str = "mindmotor:coordinator:ratelimit:"
    rate_limit_redis_timeout_s: float = Field(0.5, gt=0)  # each rate limit call to Redis (connect included)
    rate_limit_redis_skip_s: float = Field(5.0, ge=0)  # after a failed call Redis is skipped this long (fail open)

    # resuming a cut stream on another coordinator (resume.py): every coordinator of a platform needs
    # the same key ($MINDMOTOR_RESUME_KEY or the file); none: a random one (this process resumes alone)
    resume_key: str | None = None
    resume_key_file: str | None = None

    # CORS (vLLM's --allowed-origins etc.): off while no origin is allowed
    cors_allowed_origins: Annotated[list[str], NoDecode] = []    # e.g. ["https://app.example"] or ["*"]
    cors_allowed_methods: Annotated[list[str], NoDecode] = ["*"]
    cors_allowed_headers: Annotated[list[str], NoDecode] = ["*"]
    cors_allow_credentials: bool = False

    # HTTPS (both or neither): PEM certificate chain and its private key; TLS 1.2 at least
    https_cert: str | None = None
    https_key: str | None = None

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: Any) -> Any:
        value = split_list(value)
        return [WorkerEntry.parse(v) if isinstance(v, str) else v for v in (value or [])]

    @field_validator("controllers", mode="before")
    @classmethod
    def _controllers(cls, value: Any) -> Any:
        return [str(v) for v in (split_list(value) or [])]

    @field_validator("otlp_traces_endpoint")
    @classmethod
    def _otlp(cls, value: str | None) -> str | None:
        from mindmotor.common.tracing import check_endpoint

        return check_endpoint(value)

    @field_validator("api_keys", mode="before")
    @classmethod
    def _api_keys(cls, value: Any) -> Any:
        return [str(v) for v in (split_list(value) or [])]

    @field_validator("cors_allowed_origins", "cors_allowed_methods", "cors_allowed_headers", mode="before")
    @classmethod
    def _cors_lists(cls, value: Any) -> Any:
        return [str(v) for v in (split_list(value) or [])]

    @field_validator("http_protocol")
    @classmethod
    def _http_protocol(cls, value: str) -> str:
        import importlib.util

        if value == "httptools" and importlib.util.find_spec("httptools") is None:
            raise ValueError("http_protocol httptools: the httptools package is not installed")
        return value

    @field_validator("event_loop")
    @classmethod
    def _event_loop(cls, value: str) -> str:
        import importlib.util

        if value == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise ValueError("event_loop uvloop: the uvloop package is not installed")
        return value

    @model_validator(mode="after")
    def _secrets(self) -> "CoordinatorSettings":
        """The Redis URL from its file; the key file checked (read by `APIKeys`, which re-reads it
        when it changes); every secret registered for redaction."""
        from mindmotor.common.secrets import secret_list

        self.api_keys = secret_list("API keys", self.api_keys)
        if self.api_key_file:
            secret_list("API keys", file=self.api_key_file)
        if bool(self.https_cert) != bool(self.https_key):
            raise ValueError("HTTPS needs both a certificate (--https-cert) and its key (--https-key)")
        for what, path in (("certificate", self.https_cert), ("key", self.https_key)):
            if path and not Path(path).is_file():
                raise ValueError(f"the HTTPS {what} file {path} does not exist")
        return self

    @property
    def scheme(self) -> str:
        return "https" if self.https_cert else "http"

    @model_validator(mode="after")
    def _check(self) -> "CoordinatorSettings":
        check_classes(self.slo_classes, self.default_class, self.class_by_key)
        for name in [self.policy, *self.model_policies.values()]:
            if name not in POLICY_NAMES:
                raise ValueError(f"unknown routing policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
        for model, weights in self.traffic.items():
            if any(w < 0 for w in weights.values()):
                raise ValueError(f"traffic weights of {model!r} must not be negative")
        for directory in self.tokenizer_dirs():
            if not (Path(directory) / "tokenizer.json").is_file():
                raise ValueError(f"{directory}: not a checkpoint directory (no tokenizer.json)")
        if not (self.models or self.model_dir or self.workers or self.controllers):
            raise ValueError("nothing to serve: give the workers (--controller ADDR or --worker ADDR; their "
                             "models are discovered from them) or the models (--model NAME=DIR)")
        return self

    def policy_for(self, model: str) -> str:
        return self.model_policies.get(model, self.policy)

    def tokenizer_dir(self, model: str) -> str | None:
        """The local checkpoint directory of `model`'s tokenizer; None: discover it from its workers."""
        return self.models.get(model, self.model_dir)

    def tokenizer_dirs(self) -> list[str]:
        """Every local checkpoint directory (`models` and `model_dir`)."""
        return [*self.models.values(), *([self.model_dir] if self.model_dir else [])]


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> CoordinatorSettings:
    """Settings from `overrides` (flags), then the environment, then `config_file` (YAML).
    ValueError (pydantic's ValidationError) for bad values, FileNotFoundError for a missing file."""
    return CoordinatorSettings.load(config_file, **overrides)


def ready_line(port: int, replica_port: int | None = None) -> str:
    """The one line the coordinator prints on stdout when it serves."""
    return f"{READY_PREFIX} port={port}" + (f" replica_port={replica_port}" if replica_port is not None else "")
