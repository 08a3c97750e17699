"""`ControllerConfig`: where the controller listens, which store it uses, and its timeouts."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field

from mindmotor.common.store import DEFAULT_PREFIX

from .pd_settings import PDAutoscaleSettings

READY_PREFIX = "MINDMOTOR_CONTROLLER_READY"


def default_controller_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class ControllerConfig:
    host: str = "0.0.0.0"
    port: int = 50050                  # gRPC; 0: pick a free port (see the ready line)
    admin_host: str = "0.0.0.0"
    admin_port: int = 8090             # HTTP admin API; 0: pick a free port
    admin_token: str | None = None     # None: the admin API is open (a warning is logged)
    redis_url: str | None = None       # None: in-memory store (one controller)
    redis_prefix: str = DEFAULT_PREFIX
    heartbeat_interval_s: float = 1.0  # what workers are told to use
    suspect_misses: int = 3            # suspect after this many missed heartbeat intervals
    dead_after_s: float = 5.0          # MindIE Controller's heartbeat timeout
    forget_after_s: float = 60.0       # dead records are deleted this long after the last heartbeat
    lease_ttl_s: float = 2.0           # the leader lease; standbys take over within 2 × this
    controller_id: str = field(default_factory=default_controller_id)
    pd: PDAutoscaleSettings = field(default_factory=PDAutoscaleSettings)   # the P/D ratio policy

    def __post_init__(self):
        for name in ("port", "admin_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ValueError(f"{name} must be in [0, 65535], got {getattr(self, name)}")
        if self.heartbeat_interval_s <= 0 or self.lease_ttl_s <= 0:
            raise ValueError("heartbeat interval and lease ttl must be positive")
        if self.suspect_misses < 1:
            raise ValueError(f"suspect misses must be at least 1, got {self.suspect_misses}")
        if self.dead_after_s <= self.suspect_after_s:
            raise ValueError(f"dead-after ({self.dead_after_s} s) must exceed heartbeat interval × "
                             f"suspect misses ({self.suspect_after_s} s)")
        if self.forget_after_s < self.dead_after_s:
            raise ValueError("forget-after must be at least dead-after")

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
