from . import roles_pb2 as _roles_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt_text", "prompt_token_ids", "sampling", "priority", "continuation", "lora_name")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CONTINUATION_FIELD_NUMBER: _ClassVar[int]
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_text: str
    prompt_token_ids: TokenIds
    sampling: SamplingParams
    priority: int
    continuation: Continuation
    lora_name: str
    def __init__(self, request_id: _Optional[str] = ..., prompt_text: _Optional[str] = ..., prompt_token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., priority: _Optional[int] = ..., continuation: _Optional[_Union[Continuation, _Mapping]] = ..., lora_name: _Optional[str] = ...) -> None: ...

class Continuation(_message.Message):
    __slots__ = ("output_token_ids", "sent_chars", "kv_source")
    OUTPUT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SENT_CHARS_FIELD_NUMBER: _ClassVar[int]
    KV_SOURCE_FIELD_NUMBER: _ClassVar[int]
    output_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sent_chars: int
    kv_source: KVSource
    def __init__(self, output_token_ids: _Optional[_Iterable[int]] = ..., sent_chars: _Optional[int] = ..., kv_source: _Optional[_Union[KVSource, _Mapping]] = ...) -> None: ...

class KVSource(_message.Message):
    __slots__ = ("address", "handle", "node", "cached_tokens")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    address: str
    handle: str
    node: str
    cached_tokens: int
    def __init__(self, address: _Optional[str] = ..., handle: _Optional[str] = ..., node: _Optional[str] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos", "min_tokens", "presence_penalty", "frequency_penalty", "logprobs", "include_stop_str_in_output", "min_p", "repetition_penalty", "logit_bias", "allowed_token_ids", "bad_words", "prompt_logprobs", "structured", "skip_special_tokens")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BAD_WORDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    min_tokens: int
    presence_penalty: float
    frequency_penalty: float
    logprobs: int
    include_stop_str_in_output: bool
    min_p: float
    repetition_penalty: float
    logit_bias: _containers.ScalarMap[int, float]
    allowed_token_ids: _containers.RepeatedScalarFieldContainer[int]
    bad_words: _containers.RepeatedScalarFieldContainer[str]
    prompt_logprobs: int
    structured: StructuredOutput
    skip_special_tokens: bool
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., min_tokens: _Optional[int] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., logprobs: _Optional[int] = ..., include_stop_str_in_output: _Optional[bool] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., allowed_token_ids: _Optional[_Iterable[int]] = ..., bad_words: _Optional[_Iterable[str]] = ..., prompt_logprobs: _Optional[int] = ..., structured: _Optional[_Union[StructuredOutput, _Mapping]] = ..., skip_special_tokens: _Optional[bool] = ...) -> None: ...

class StructuredOutput(_message.Message):
    __slots__ = ("kind", "spec")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    kind: str
    spec: str
    def __init__(self, kind: _Optional[str] = ..., spec: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "token_ids", "text", "logprobs", "finish_reason", "stop_token_id", "stop_string", "usage", "prompt_logprobs", "keepalive", "timings")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    STOP_STRING_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    finish_reason: str
    stop_token_id: int
    stop_string: str
    usage: Usage
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    keepalive: bool
    timings: RequestTimings
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., finish_reason: _Optional[str] = ..., stop_token_id: _Optional[int] = ..., stop_string: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., keepalive: _Optional[bool] = ..., timings: _Optional[_Union[RequestTimings, _Mapping]] = ...) -> None: ...

class RequestTimings(_message.Message):
    __slots__ = ("queued_s", "prefill_s", "decode_s", "preemptions")
    QUEUED_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_S_FIELD_NUMBER: _ClassVar[int]
    DECODE_S_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    queued_s: float
    prefill_s: float
    decode_s: float
    preemptions: int
    def __init__(self, queued_s: _Optional[float] = ..., prefill_s: _Optional[float] = ..., decode_s: _Optional[float] = ..., preemptions: _Optional[int] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "top", "rank")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    rank: int
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ..., rank: _Optional[int] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("request_id", "prompt_text", "prompt_token_ids", "sampling", "priority", "lora_name")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_text: str
    prompt_token_ids: TokenIds
    sampling: SamplingParams
    priority: int
    lora_name: str
    def __init__(self, request_id: _Optional[str] = ..., prompt_text: _Optional[str] = ..., prompt_token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., priority: _Optional[int] = ..., lora_name: _Optional[str] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("handle", "token_ids", "text", "logprobs", "finish_reason", "stop_token_id", "stop_string", "usage", "prompt_token_ids", "node", "block_size", "num_blocks", "prompt_logprobs")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    STOP_STRING_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    handle: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    finish_reason: str
    stop_token_id: int
    stop_string: str
    usage: Usage
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    node: str
    block_size: int
    num_blocks: int
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, handle: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., finish_reason: _Optional[str] = ..., stop_token_id: _Optional[int] = ..., stop_string: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., node: _Optional[str] = ..., block_size: _Optional[int] = ..., num_blocks: _Optional[int] = ..., prompt_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class PullKVRequest(_message.Message):
    __slots__ = ("handle", "skip_blocks", "blocks_per_chunk")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    SKIP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_PER_CHUNK_FIELD_NUMBER: _ClassVar[int]
    handle: str
    skip_blocks: int
    blocks_per_chunk: int
    def __init__(self, handle: _Optional[str] = ..., skip_blocks: _Optional[int] = ..., blocks_per_chunk: _Optional[int] = ...) -> None: ...

class KVChunk(_message.Message):
    __slots__ = ("first_block", "shape", "dtype", "k", "v", "total_blocks")
    FIRST_BLOCK_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    V_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    first_block: int
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    k: bytes
    v: bytes
    total_blocks: int
    def __init__(self, first_block: _Optional[int] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., k: _Optional[bytes] = ..., v: _Optional[bytes] = ..., total_blocks: _Optional[int] = ...) -> None: ...

class ReleaseKVRequest(_message.Message):
    __slots__ = ("handle",)
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    handle: str
    def __init__(self, handle: _Optional[str] = ...) -> None: ...

class ReleaseKVResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class SetRoleRequest(_message.Message):
    __slots__ = ("role", "drain_timeout_s")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    role: _roles_pb2.Role
    drain_timeout_s: float
    def __init__(self, role: _Optional[_Union[_roles_pb2.Role, str]] = ..., drain_timeout_s: _Optional[float] = ...) -> None: ...

class SetRoleResponse(_message.Message):
    __slots__ = ("previous_role", "role", "drained")
    PREVIOUS_ROLE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    previous_role: _roles_pb2.Role
    role: _roles_pb2.Role
    drained: bool
    def __init__(self, previous_role: _Optional[_Union[_roles_pb2.Role, str]] = ..., role: _Optional[_Union[_roles_pb2.Role, str]] = ..., drained: _Optional[bool] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class RecallRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class RecallResponse(_message.Message):
    __slots__ = ("digest", "output_token_ids", "finish_reason", "stop_token_id", "stop_string")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    STOP_STRING_FIELD_NUMBER: _ClassVar[int]
    digest: bytes
    output_token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    stop_token_id: int
    stop_string: str
    def __init__(self, digest: _Optional[bytes] = ..., output_token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., stop_token_id: _Optional[int] = ..., stop_string: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("worker_id", "model", "max_model_len", "block_size", "role", "state", "load", "device", "emulated_profile", "timing", "node")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    EMULATED_PROFILE_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    model: str
    max_model_len: int
    block_size: int
    role: _roles_pb2.Role
    state: str
    load: Load
    device: DeviceStatus
    emulated_profile: str
    timing: str
    node: str
    def __init__(self, worker_id: _Optional[str] = ..., model: _Optional[str] = ..., max_model_len: _Optional[int] = ..., block_size: _Optional[int] = ..., role: _Optional[_Union[_roles_pb2.Role, str]] = ..., state: _Optional[str] = ..., load: _Optional[_Union[Load, _Mapping]] = ..., device: _Optional[_Union[DeviceStatus, _Mapping]] = ..., emulated_profile: _Optional[str] = ..., timing: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class Load(_message.Message):
    __slots__ = ("running", "waiting", "in_flight", "kv_usage", "num_blocks", "num_free_blocks", "prefix_hit_rate", "num_preemptions", "prompt_tokens", "generation_tokens", "steps", "emulated_time_s", "host_time_s", "lag_time_s", "kv_pinned", "kv_transfers", "kv_transfer_s", "iteration_token_counts", "iteration_tokens_sum")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    NUM_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    EMULATED_TIME_S_FIELD_NUMBER: _ClassVar[int]
    HOST_TIME_S_FIELD_NUMBER: _ClassVar[int]
    LAG_TIME_S_FIELD_NUMBER: _ClassVar[int]
    KV_PINNED_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFERS_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    ITERATION_TOKEN_COUNTS_FIELD_NUMBER: _ClassVar[int]
    ITERATION_TOKENS_SUM_FIELD_NUMBER: _ClassVar[int]
    running: int
    waiting: int
    in_flight: int
    kv_usage: float
    num_blocks: int
    num_free_blocks: int
    prefix_hit_rate: float
    num_preemptions: int
    prompt_tokens: int
    generation_tokens: int
    steps: int
    emulated_time_s: float
    host_time_s: float
    lag_time_s: float
    kv_pinned: int
    kv_transfers: int
    kv_transfer_s: float
    iteration_token_counts: _containers.RepeatedScalarFieldContainer[int]
    iteration_tokens_sum: float
    def __init__(self, running: _Optional[int] = ..., waiting: _Optional[int] = ..., in_flight: _Optional[int] = ..., kv_usage: _Optional[float] = ..., num_blocks: _Optional[int] = ..., num_free_blocks: _Optional[int] = ..., prefix_hit_rate: _Optional[float] = ..., num_preemptions: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., generation_tokens: _Optional[int] = ..., steps: _Optional[int] = ..., emulated_time_s: _Optional[float] = ..., host_time_s: _Optional[float] = ..., lag_time_s: _Optional[float] = ..., kv_pinned: _Optional[int] = ..., kv_transfers: _Optional[int] = ..., kv_transfer_s: _Optional[float] = ..., iteration_token_counts: _Optional[_Iterable[int]] = ..., iteration_tokens_sum: _Optional[float] = ...) -> None: ...

class DeviceStatus(_message.Message):
    __slots__ = ("device", "npu_id", "utilization", "hbm_used_bytes", "hbm_total_bytes", "power_w", "temperature_c", "aicore_freq_mhz", "health")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    NPU_ID_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    HBM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    HBM_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    AICORE_FREQ_MHZ_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    device: str
    npu_id: int
    utilization: float
    hbm_used_bytes: int
    hbm_total_bytes: int
    power_w: float
    temperature_c: float
    aicore_freq_mhz: int
    health: str
    def __init__(self, device: _Optional[str] = ..., npu_id: _Optional[int] = ..., utilization: _Optional[float] = ..., hbm_used_bytes: _Optional[int] = ..., hbm_total_bytes: _Optional[int] = ..., power_w: _Optional[float] = ..., temperature_c: _Optional[float] = ..., aicore_freq_mhz: _Optional[int] = ..., health: _Optional[str] = ...) -> None: ...

class ModelInfoRequest(_message.Message):
    __slots__ = ("digest_only",)
    DIGEST_ONLY_FIELD_NUMBER: _ClassVar[int]
    digest_only: bool
    def __init__(self, digest_only: _Optional[bool] = ...) -> None: ...

class ModelInfoResponse(_message.Message):
    __slots__ = ("model", "max_model_len", "tokenizer_json", "tokenizer_config_json", "generation_config_json", "tokenizer_digest")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_JSON_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    GENERATION_CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_DIGEST_FIELD_NUMBER: _ClassVar[int]
    model: str
    max_model_len: int
    tokenizer_json: bytes
    tokenizer_config_json: bytes
    generation_config_json: bytes
    tokenizer_digest: str
    def __init__(self, model: _Optional[str] = ..., max_model_len: _Optional[int] = ..., tokenizer_json: _Optional[bytes] = ..., tokenizer_config_json: _Optional[bytes] = ..., generation_config_json: _Optional[bytes] = ..., tokenizer_digest: _Optional[str] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("wait", "timeout_s")
    WAIT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    wait: bool
    timeout_s: float
    def __init__(self, wait: _Optional[bool] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("in_flight", "drained")
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    in_flight: int
    drained: bool
    def __init__(self, in_flight: _Optional[int] = ..., drained: _Optional[bool] = ...) -> None: ...

class LoadLoraAdapterRequest(_message.Message):
    __slots__ = ("lora_name", "lora_path")
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    LORA_PATH_FIELD_NUMBER: _ClassVar[int]
    lora_name: str
    lora_path: str
    def __init__(self, lora_name: _Optional[str] = ..., lora_path: _Optional[str] = ...) -> None: ...

class UnloadLoraAdapterRequest(_message.Message):
    __slots__ = ("lora_name",)
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    lora_name: str
    def __init__(self, lora_name: _Optional[str] = ...) -> None: ...

class ListLoraAdaptersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LoraAdapter(_message.Message):
    __slots__ = ("name", "path", "rank", "resident", "requests")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    rank: int
    resident: bool
    requests: int
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., rank: _Optional[int] = ..., resident: _Optional[bool] = ..., requests: _Optional[int] = ...) -> None: ...

class LoraAdapters(_message.Message):
    __slots__ = ("enabled", "adapters", "max_loras", "max_lora_rank", "running", "waiting")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    MAX_LORAS_FIELD_NUMBER: _ClassVar[int]
    MAX_LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    adapters: _containers.RepeatedCompositeFieldContainer[LoraAdapter]
    max_loras: int
    max_lora_rank: int
    running: _containers.RepeatedScalarFieldContainer[str]
    waiting: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, enabled: _Optional[bool] = ..., adapters: _Optional[_Iterable[_Union[LoraAdapter, _Mapping]]] = ..., max_loras: _Optional[int] = ..., max_lora_rank: _Optional[int] = ..., running: _Optional[_Iterable[str]] = ..., waiting: _Optional[_Iterable[str]] = ...) -> None: ...
