"""`ControllerConfig`: where the controller listens, which store it uses, its timeouts and its P/D
ratio policy — from flags, `MINDMOTOR_*` environment variables and a YAML file (common/settings.py).

    port: 50050
    admin_port: 8090
    redis_url_file: /run/secrets/redis-url     # or $MINDMOTOR_REDIS_URL; none: in memory (one controller)
    heartbeat_interval_s: 1.0
    dead_after_s: 5.0
    pd_autoscale: true
    pd_slo: ["deployment=chat,ttft_ms=500,tpot_ms=40"]
"""

from __future__ import annotations

import os
import socket
import uuid
from functools import cached_property
from typing import Annotated, ClassVar

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from mindmotor.common.exposure import DEFAULT_HOST, require_admin_token
from mindmotor.common.settings import ServiceSettings, split_list
from mindmotor.common.store import DEFAULT_PREFIX

from .pd_ratio import RatioPolicyConfig
from .pd_settings import PDAutoscaleSettings, make_slo, parse_slo

READY_PREFIX = "MINDMOTOR_CONTROLLER_READY"
Port = Field(ge=0, le=65535)


def default_controller_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class ControllerConfig(ServiceSettings):
    secrets: ClassVar = {"admin_token": "admin token", "redis_url": "Redis URL"}

    # serving
    host: str = DEFAULT_HOST
    port: Annotated[int, Port] = 50050               # gRPC; 0: pick a free port (see the ready line)
    admin_host: str = DEFAULT_HOST                   # beyond loopback it needs an admin token
    admin_port: Annotated[int, Port] = 8090          # HTTP admin API; 0: pick a free port
    admin_token: str | None = None                   # $MINDMOTOR_ADMIN_TOKEN ...
    admin_token_file: str | None = None              # ... or a file holding it; none: the admin API is open
    allow_open_admin: bool = False                   # open beyond loopback on purpose
    controller_id: str = Field(default_factory=default_controller_id)   # in logs, metrics and the lease
    log_level: str = "INFO"

    # store
    redis_url: str | None = None                     # $MINDMOTOR_REDIS_URL or the file; none: in memory
                                                     # (one controller)
    redis_url_file: str | None = None
    redis_prefix: str = DEFAULT_PREFIX

    # health
    heartbeat_interval_s: float = Field(1.0, gt=0)   # what workers are told to use
    suspect_misses: int = Field(3, ge=1)             # suspect after this many missed heartbeat intervals
    dead_after_s: float = 5.0                        # MindIE Controller's heartbeat timeout
    forget_after_s: float = 60.0                     # dead records are deleted this long after the last heartbeat
                                                     # (at least dead_after_s)
    lease_ttl_s: float = Field(2.0, gt=0)            # the leader lease; standbys take over within 2 × this

    # the P/D ratio policy (pd_ratio.py)
    pd_autoscale: bool = False
    pd_ttft_slo_ms: float = 1000.0                   # default p90 targets
    pd_tpot_slo_ms: float = 50.0
    pd_slo: Annotated[list[str], NoDecode] = []      # "deployment=NAME,ttft_ms=N,tpot_ms=N" (or model=NAME)
    pd_sustain_s: float = 30.0                       # a one-sided miss must last this long before a switch
    pd_dwell_s: float = 120.0                        # minimum time between two switches of one deployment
    pd_headroom: float = 0.7                         # the other side must be under this fraction of its target
    pd_every: int = 3                                # evaluate every this many heartbeat intervals

    @field_validator("pd_slo", mode="before")
    @classmethod
    def _pd_slo(cls, value):
        """From the environment: one target, or a JSON list of them (a target has commas of its own)."""
        if isinstance(value, str):
            return split_list(value) if value.strip().startswith("[") else [value]
        return value

    @model_validator(mode="after")
    def _check(self) -> "ControllerConfig":
        if self.dead_after_s <= self.suspect_after_s:
            raise ValueError(f"dead-after ({self.dead_after_s} s) must exceed heartbeat interval × "
                             f"suspect misses ({self.suspect_after_s} s)")
        self.forget_after_s = max(self.forget_after_s, self.dead_after_s)
        self.pd                                          # the P/D settings, checked now
        require_admin_token("the controller admin API", self.admin_host, self.admin_token, self.allow_open_admin)
        return self

    @cached_property
    def pd(self) -> PDAutoscaleSettings:
        """The P/D ratio policy's settings (ValueError for bad targets)."""
        default = make_slo(self.pd_ttft_slo_ms, self.pd_tpot_slo_ms)
        return PDAutoscaleSettings(
            enabled=self.pd_autoscale, default_slo=default, slos=dict(parse_slo(s, default) for s in self.pd_slo),
            policy=RatioPolicyConfig(headroom=self.pd_headroom, sustain_s=self.pd_sustain_s, dwell_s=self.pd_dwell_s),
            every_heartbeats=self.pd_every)

    @property
    def suspect_after_s(self) -> float:
        return self.heartbeat_interval_s * self.suspect_misses

    @property
    def sweep_interval_s(self) -> float:
        """How often the leader checks the timeouts."""
        return min(self.heartbeat_interval_s / 2, 0.5)

    @property
    def pd_interval_s(self) -> float:
        """How often the leader evaluates the P/D ratio policy."""
        return self.heartbeat_interval_s * self.pd.every_heartbeats

    @property
    def store_kind(self) -> str:
        return "redis" if self.redis_url else "memory"


def ready_line(port: int, admin_port: int) -> str:
    """The one line the controller prints on stdout when it serves (launchers and tests wait for it)."""
    return f"{READY_PREFIX} port={port} admin_port={admin_port}"
