from . import roles_pb2 as _roles_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterRequest(_message.Message):
    __slots__ = ("instance_id", "address", "metrics_address", "model", "role", "device", "max_model_len", "block_size", "deployment", "version", "weight")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    address: str
    metrics_address: str
    model: str
    role: _roles_pb2.Role
    device: str
    max_model_len: int
    block_size: int
    deployment: str
    version: str
    weight: float
    def __init__(self, instance_id: _Optional[str] = ..., address: _Optional[str] = ..., metrics_address: _Optional[str] = ..., model: _Optional[str] = ..., role: _Optional[_Union[_roles_pb2.Role, str]] = ..., device: _Optional[str] = ..., max_model_len: _Optional[int] = ..., block_size: _Optional[int] = ..., deployment: _Optional[str] = ..., version: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("accepted", "message", "heartbeat_interval_s", "suspect_after_s", "dead_after_s", "controller_id", "state")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    SUSPECT_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    DEAD_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    message: str
    heartbeat_interval_s: float
    suspect_after_s: float
    dead_after_s: float
    controller_id: str
    state: str
    def __init__(self, accepted: _Optional[bool] = ..., message: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., suspect_after_s: _Optional[float] = ..., dead_after_s: _Optional[float] = ..., controller_id: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("instance_id", "running", "waiting", "kv_usage", "outstanding_tokens", "state", "role", "cached_blocks", "ttft_p90_s", "tpot_p90_s", "ttft_samples", "tpot_samples", "iteration_token_counts", "iteration_tokens_sum")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TTFT_P90_S_FIELD_NUMBER: _ClassVar[int]
    TPOT_P90_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TPOT_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    ITERATION_TOKEN_COUNTS_FIELD_NUMBER: _ClassVar[int]
    ITERATION_TOKENS_SUM_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    running: int
    waiting: int
    kv_usage: float
    outstanding_tokens: int
    state: str
    role: _roles_pb2.Role
    cached_blocks: CachedBlocks
    ttft_p90_s: float
    tpot_p90_s: float
    ttft_samples: int
    tpot_samples: int
    iteration_token_counts: _containers.RepeatedScalarFieldContainer[int]
    iteration_tokens_sum: float
    def __init__(self, instance_id: _Optional[str] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., kv_usage: _Optional[float] = ..., outstanding_tokens: _Optional[int] = ..., state: _Optional[str] = ..., role: _Optional[_Union[_roles_pb2.Role, str]] = ..., cached_blocks: _Optional[_Union[CachedBlocks, _Mapping]] = ..., ttft_p90_s: _Optional[float] = ..., tpot_p90_s: _Optional[float] = ..., ttft_samples: _Optional[int] = ..., tpot_samples: _Optional[int] = ..., iteration_token_counts: _Optional[_Iterable[int]] = ..., iteration_tokens_sum: _Optional[float] = ...) -> None: ...

class CachedBlocks(_message.Message):
    __slots__ = ("hashes",)
    HASHES_FIELD_NUMBER: _ClassVar[int]
    hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class HeartbeatCommand(_message.Message):
    __slots__ = ("drain", "set_role", "reregister")
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    SET_ROLE_FIELD_NUMBER: _ClassVar[int]
    REREGISTER_FIELD_NUMBER: _ClassVar[int]
    drain: DrainCommand
    set_role: SetRoleCommand
    reregister: ReregisterCommand
    def __init__(self, drain: _Optional[_Union[DrainCommand, _Mapping]] = ..., set_role: _Optional[_Union[SetRoleCommand, _Mapping]] = ..., reregister: _Optional[_Union[ReregisterCommand, _Mapping]] = ...) -> None: ...

class DrainCommand(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class SetRoleCommand(_message.Message):
    __slots__ = ("role",)
    ROLE_FIELD_NUMBER: _ClassVar[int]
    role: _roles_pb2.Role
    def __init__(self, role: _Optional[_Union[_roles_pb2.Role, str]] = ...) -> None: ...

class ReregisterCommand(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class RoutingTable(_message.Message):
    __slots__ = ("version", "instances", "controller_id", "from_leader", "generated_at", "traffic")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_LEADER_FIELD_NUMBER: _ClassVar[int]
    GENERATED_AT_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    version: int
    instances: _containers.RepeatedCompositeFieldContainer[InstanceInfo]
    controller_id: str
    from_leader: bool
    generated_at: float
    traffic: _containers.RepeatedCompositeFieldContainer[TrafficSplit]
    def __init__(self, version: _Optional[int] = ..., instances: _Optional[_Iterable[_Union[InstanceInfo, _Mapping]]] = ..., controller_id: _Optional[str] = ..., from_leader: _Optional[bool] = ..., generated_at: _Optional[float] = ..., traffic: _Optional[_Iterable[_Union[TrafficSplit, _Mapping]]] = ...) -> None: ...

class TrafficSplit(_message.Message):
    __slots__ = ("deployment", "model", "weights", "adapter")
    class WeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    model: str
    weights: _containers.ScalarMap[str, float]
    adapter: str
    def __init__(self, deployment: _Optional[str] = ..., model: _Optional[str] = ..., weights: _Optional[_Mapping[str, float]] = ..., adapter: _Optional[str] = ...) -> None: ...

class InstanceInfo(_message.Message):
    __slots__ = ("instance_id", "address", "metrics_address", "model", "role", "device", "max_model_len", "block_size", "deployment", "version", "weight", "state", "routable", "load", "cached_block_hashes")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ROUTABLE_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    address: str
    metrics_address: str
    model: str
    role: _roles_pb2.Role
    device: str
    max_model_len: int
    block_size: int
    deployment: str
    version: str
    weight: float
    state: str
    routable: bool
    load: InstanceLoad
    cached_block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, instance_id: _Optional[str] = ..., address: _Optional[str] = ..., metrics_address: _Optional[str] = ..., model: _Optional[str] = ..., role: _Optional[_Union[_roles_pb2.Role, str]] = ..., device: _Optional[str] = ..., max_model_len: _Optional[int] = ..., block_size: _Optional[int] = ..., deployment: _Optional[str] = ..., version: _Optional[str] = ..., weight: _Optional[float] = ..., state: _Optional[str] = ..., routable: _Optional[bool] = ..., load: _Optional[_Union[InstanceLoad, _Mapping]] = ..., cached_block_hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class InstanceLoad(_message.Message):
    __slots__ = ("running", "waiting", "kv_usage", "outstanding_tokens", "iteration_token_counts", "iteration_tokens_sum")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ITERATION_TOKEN_COUNTS_FIELD_NUMBER: _ClassVar[int]
    ITERATION_TOKENS_SUM_FIELD_NUMBER: _ClassVar[int]
    running: int
    waiting: int
    kv_usage: float
    outstanding_tokens: int
    iteration_token_counts: _containers.RepeatedScalarFieldContainer[int]
    iteration_tokens_sum: float
    def __init__(self, running: _Optional[int] = ..., waiting: _Optional[int] = ..., kv_usage: _Optional[float] = ..., outstanding_tokens: _Optional[int] = ..., iteration_token_counts: _Optional[_Iterable[int]] = ..., iteration_tokens_sum: _Optional[float] = ...) -> None: ...

class ReportFailureRequest(_message.Message):
    __slots__ = ("instance_id", "reason", "reporter")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REPORTER_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    reason: str
    reporter: str
    def __init__(self, instance_id: _Optional[str] = ..., reason: _Optional[str] = ..., reporter: _Optional[str] = ...) -> None: ...

class ReportFailureResponse(_message.Message):
    __slots__ = ("found", "state")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    found: bool
    state: str
    def __init__(self, found: _Optional[bool] = ..., state: _Optional[str] = ...) -> None: ...

class DeregisterRequest(_message.Message):
    __slots__ = ("instance_id",)
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    def __init__(self, instance_id: _Optional[str] = ...) -> None: ...

class DeregisterResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class SetTrafficRequest(_message.Message):
    __slots__ = ("deployment", "model", "weights", "adapter")
    class WeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    model: str
    weights: _containers.ScalarMap[str, float]
    adapter: str
    def __init__(self, deployment: _Optional[str] = ..., model: _Optional[str] = ..., weights: _Optional[_Mapping[str, float]] = ..., adapter: _Optional[str] = ...) -> None: ...

class SetTrafficResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...
