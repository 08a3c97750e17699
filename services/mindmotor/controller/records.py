"""`InstanceRecord`: what the controller knows of one instance, as stored (JSON) and as sent in
the routing table (`InstanceInfo`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from mindmotor.common.roles import Role
from mindmotor.vocabulary import INSTANCE_STATES_ROUTABLE, InstanceState, WorkerState
from mindmotor.protocol import controller_pb2


# Fields whose change is a routing change (bumps the table version); load is not.
ROUTING_FIELDS = ("address", "metrics_address", "model", "role", "device", "max_model_len", "block_size",
                  "deployment", "version", "weight", "state")


@dataclass
class InstanceRecord:
    instance_id: str
    address: str
    model: str
    metrics_address: str = ""
    role: str = "mixed"
    device: str = ""
    max_model_len: int = 0
    block_size: int = 0
    deployment: str = ""
    version: str = ""
    weight: float = 1.0
    # health
    state: str = InstanceState.STARTING
    state_since: float = 0.0           # unix seconds
    reason: str = ""                   # why the last state change happened
    registered_at: float = 0.0
    last_heartbeat: float = 0.0        # 0: never
    heartbeats: int = 0
    reported_state: str = WorkerState.SERVING
    suspect_until: float = 0.0         # a failure report holds "suspect" until then
    failures: int = 0
    drain_commanded: bool = False
    # load, from the last heartbeat
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    outstanding_tokens: int = 0
    ttft_p90_s: float = 0.0            # recent latency measured by the worker (0 samples: none)
    tpot_p90_s: float = 0.0
    ttft_samples: int = 0
    tpot_samples: int = 0
    iteration_token_counts: list[int] = field(default_factory=list)  # vLLM's iteration_tokens_total
    iteration_tokens_sum: float = 0.0
    cached_block_hashes: list[str] = field(default_factory=list)   # hex, newest first
    # commands waiting for the worker's next heartbeat: [{"drain": {...}} | {"set_role": {...}}]
    commands: list[dict] = field(default_factory=list)
    owner: str = ""                    # who registered it (common.rpc Caller.identity): only it may act on it

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "InstanceRecord":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})   # unknown keys: a newer writer

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def copy(self) -> "InstanceRecord":
        return InstanceRecord.from_dict(self.to_dict())

    def routing_key(self) -> tuple:
        return tuple(getattr(self, name) for name in ROUTING_FIELDS)

    @property
    def routable(self) -> bool:
        return self.state in INSTANCE_STATES_ROUTABLE

    def to_info(self) -> controller_pb2.InstanceInfo:
        return controller_pb2.InstanceInfo(
            instance_id=self.instance_id, address=self.address, metrics_address=self.metrics_address,
            model=self.model, role=Role(self.role).to_proto(), device=self.device, max_model_len=self.max_model_len,
            block_size=self.block_size, deployment=self.deployment, version=self.version, weight=self.weight,
            state=self.state, routable=self.routable,
            load=controller_pb2.InstanceLoad(running=self.running, waiting=self.waiting, kv_usage=self.kv_usage,
                                             outstanding_tokens=self.outstanding_tokens,
                                             iteration_token_counts=self.iteration_token_counts,
                                             iteration_tokens_sum=self.iteration_tokens_sum),
            cached_block_hashes=[bytes.fromhex(h) for h in self.cached_block_hashes])

    def to_admin_json(self, now: float) -> dict[str, Any]:
        """The record for `GET /v1/instances`: everything but the hash list (its length instead)."""
        data = self.to_dict()
        data["cached_blocks"] = len(data.pop("cached_block_hashes"))
        data["routable"] = self.routable
        data["last_heartbeat_age_s"] = round(now - self.last_heartbeat, 3) if self.last_heartbeat else None
        return data


def record_from_register(request: controller_pb2.RegisterRequest, now: float) -> InstanceRecord:
    return InstanceRecord(
        instance_id=request.instance_id, address=request.address, model=request.model,
        metrics_address=request.metrics_address, role=Role.from_proto(request.role, Role.MIXED).value,
        device=request.device,
        max_model_len=request.max_model_len, block_size=request.block_size, deployment=request.deployment,
        version=request.version, weight=request.weight if request.weight > 0 else 1.0,
        state=InstanceState.STARTING, state_since=now, reason="registered", registered_at=now)


def validate_register(request: controller_pb2.RegisterRequest) -> str | None:
    """The problem with a registration, or None."""
    for name in ("instance_id", "address", "model"):
        if not getattr(request, name):
            return f"{name} is required"
    try:
        Role.from_proto(request.role)
    except ValueError as exc:
        return str(exc)
    if request.weight < 0:
        return f"weight must be at least 0, got {request.weight}"
    return None
