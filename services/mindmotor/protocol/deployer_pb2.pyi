from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeploymentSpec(_message.Message):
    __slots__ = ("name", "model", "versions", "traffic", "adapter_traffic")
    class TrafficEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class AdapterTrafficEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AdapterTraffic
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AdapterTraffic, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    versions: _containers.RepeatedCompositeFieldContainer[VersionSpec]
    traffic: _containers.ScalarMap[str, float]
    adapter_traffic: _containers.MessageMap[str, AdapterTraffic]
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., versions: _Optional[_Iterable[_Union[VersionSpec, _Mapping]]] = ..., traffic: _Optional[_Mapping[str, float]] = ..., adapter_traffic: _Optional[_Mapping[str, AdapterTraffic]] = ...) -> None: ...

class AdapterTraffic(_message.Message):
    __slots__ = ("weights",)
    class WeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    weights: _containers.ScalarMap[str, float]
    def __init__(self, weights: _Optional[_Mapping[str, float]] = ...) -> None: ...

class VersionSpec(_message.Message):
    __slots__ = ("name", "checkpoint", "replicas", "prefill", "decode", "worker", "resources")
    class WorkerEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    name: str
    checkpoint: str
    replicas: int
    prefill: int
    decode: int
    worker: _containers.ScalarMap[str, str]
    resources: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., checkpoint: _Optional[str] = ..., replicas: _Optional[int] = ..., prefill: _Optional[int] = ..., decode: _Optional[int] = ..., worker: _Optional[_Mapping[str, str]] = ..., resources: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Deployment(_message.Message):
    __slots__ = ("spec", "generation", "rollout", "versions", "deleting", "updated_at")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    DELETING_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    spec: DeploymentSpec
    generation: int
    rollout: RolloutStatus
    versions: _containers.RepeatedCompositeFieldContainer[VersionStatus]
    deleting: bool
    updated_at: float
    def __init__(self, spec: _Optional[_Union[DeploymentSpec, _Mapping]] = ..., generation: _Optional[int] = ..., rollout: _Optional[_Union[RolloutStatus, _Mapping]] = ..., versions: _Optional[_Iterable[_Union[VersionStatus, _Mapping]]] = ..., deleting: _Optional[bool] = ..., updated_at: _Optional[float] = ...) -> None: ...

class VersionStatus(_message.Message):
    __slots__ = ("version", "desired", "running", "ready", "restarts", "weight", "last_failure")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    LAST_FAILURE_FIELD_NUMBER: _ClassVar[int]
    version: str
    desired: int
    running: int
    ready: int
    restarts: int
    weight: float
    last_failure: str
    def __init__(self, version: _Optional[str] = ..., desired: _Optional[int] = ..., running: _Optional[int] = ..., ready: _Optional[int] = ..., restarts: _Optional[int] = ..., weight: _Optional[float] = ..., last_failure: _Optional[str] = ...) -> None: ...

class RolloutStatus(_message.Message):
    __slots__ = ("version", "previous", "canary", "phase", "reason", "started_at", "deadline", "updated_at", "analysis", "tokenizer_change", "canary_at", "figures", "adapter", "adapter_path")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_CHANGE_FIELD_NUMBER: _ClassVar[int]
    CANARY_AT_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_PATH_FIELD_NUMBER: _ClassVar[int]
    version: str
    previous: str
    canary: float
    phase: str
    reason: str
    started_at: float
    deadline: float
    updated_at: float
    analysis: RolloutAnalysis
    tokenizer_change: bool
    canary_at: float
    figures: str
    adapter: str
    adapter_path: str
    def __init__(self, version: _Optional[str] = ..., previous: _Optional[str] = ..., canary: _Optional[float] = ..., phase: _Optional[str] = ..., reason: _Optional[str] = ..., started_at: _Optional[float] = ..., deadline: _Optional[float] = ..., updated_at: _Optional[float] = ..., analysis: _Optional[_Union[RolloutAnalysis, _Mapping]] = ..., tokenizer_change: _Optional[bool] = ..., canary_at: _Optional[float] = ..., figures: _Optional[str] = ..., adapter: _Optional[str] = ..., adapter_path: _Optional[str] = ...) -> None: ...

class RolloutAnalysis(_message.Message):
    __slots__ = ("enabled", "max_error_rate_increase", "max_ttft_p90_increase", "window_s", "min_requests")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    MAX_ERROR_RATE_INCREASE_FIELD_NUMBER: _ClassVar[int]
    MAX_TTFT_P90_INCREASE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    MIN_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    max_error_rate_increase: float
    max_ttft_p90_increase: float
    window_s: float
    min_requests: int
    def __init__(self, enabled: _Optional[bool] = ..., max_error_rate_increase: _Optional[float] = ..., max_ttft_p90_increase: _Optional[float] = ..., window_s: _Optional[float] = ..., min_requests: _Optional[int] = ...) -> None: ...

class ApplyRequest(_message.Message):
    __slots__ = ("spec", "allow_tokenizer_change")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    ALLOW_TOKENIZER_CHANGE_FIELD_NUMBER: _ClassVar[int]
    spec: DeploymentSpec
    allow_tokenizer_change: bool
    def __init__(self, spec: _Optional[_Union[DeploymentSpec, _Mapping]] = ..., allow_tokenizer_change: _Optional[bool] = ...) -> None: ...

class GetDeploymentRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListDeploymentsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListDeploymentsResponse(_message.Message):
    __slots__ = ("deployments",)
    DEPLOYMENTS_FIELD_NUMBER: _ClassVar[int]
    deployments: _containers.RepeatedCompositeFieldContainer[Deployment]
    def __init__(self, deployments: _Optional[_Iterable[_Union[Deployment, _Mapping]]] = ...) -> None: ...

class DeleteDeploymentRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class SetDeploymentTrafficRequest(_message.Message):
    __slots__ = ("name", "weights", "adapter")
    class WeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    name: str
    weights: _containers.ScalarMap[str, float]
    adapter: str
    def __init__(self, name: _Optional[str] = ..., weights: _Optional[_Mapping[str, float]] = ..., adapter: _Optional[str] = ...) -> None: ...

class RolloutRequest(_message.Message):
    __slots__ = ("name", "version", "checkpoint", "canary", "replicas", "previous", "ready_timeout_s", "allow_tokenizer_change", "analysis", "disable_analysis", "adapter", "adapter_path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    READY_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    ALLOW_TOKENIZER_CHANGE_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_FIELD_NUMBER: _ClassVar[int]
    DISABLE_ANALYSIS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    checkpoint: str
    canary: float
    replicas: int
    previous: str
    ready_timeout_s: float
    allow_tokenizer_change: bool
    analysis: RolloutAnalysis
    disable_analysis: bool
    adapter: str
    adapter_path: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., checkpoint: _Optional[str] = ..., canary: _Optional[float] = ..., replicas: _Optional[int] = ..., previous: _Optional[str] = ..., ready_timeout_s: _Optional[float] = ..., allow_tokenizer_change: _Optional[bool] = ..., analysis: _Optional[_Union[RolloutAnalysis, _Mapping]] = ..., disable_analysis: _Optional[bool] = ..., adapter: _Optional[str] = ..., adapter_path: _Optional[str] = ...) -> None: ...

class PromoteRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ("name", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    reason: str
    def __init__(self, name: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...
