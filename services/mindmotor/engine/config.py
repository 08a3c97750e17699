"""`EngineConfig`: one frozen dataclass for everything an engine needs; each part takes its slice."""

from __future__ import annotations

from dataclasses import dataclass

TIMING_MODES = ("realtime", "virtual")
RUNNERS = ("model", "cost_only")       # engine/model_runner.py, engine/cost_only_runner.py


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None              # checkpoint directory; None: the bundled demo model
    device: str = "910B3"                 # emulated device (mindmotor.device.specs)
    emulate: str | None = None            # emulated model profile ("qwen2-7b", ...); None: the served model
    tensor_parallel: int = 1              # of the emulated profile
    timing: str = "virtual"               # "realtime": steps take the emulated time; "virtual": no waiting
    memory_fraction: float = 0.8          # of HBM for weights + workspace + KV (MindIE NPU_MEMORY_FRACTION)
    block_size: int = 16                  # tokens per KV block
    num_blocks: int | None = None         # override the KV pool size (tests); None: from the device plan
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None      # None: the model's max_position_embeddings
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    # The library defaults are vLLM's; `mindmotor worker` serves with a bounded step (worker/cli.py).
    long_prefill_token_threshold: int = 0  # new tokens of one prefill per step; 0: no cap
    max_num_partial_prefills: int = 1      # prompts part-way through their prefill at once
    max_num_batched_attention: int | None = 0  # prefill query–key pairs per step; 0: no limit; None: from
                                           # the served model's host cost (engine/step_budget.py)
    # SLO classes (engine/scheduler.py, "Classes"): lower `priority` runs first and may preempt higher
    priority_aging_s: float = 0.0          # a request waiting this long goes ahead of all that have not
                                          # (and is not preempted for them): a bounded wait; 0: no aging
    lower_class_prefill_tokens: int = 0    # in a step with more urgent work, less urgent prompts' chunks get
                                          # at most this many tokens together; 0: no cap
    preferred_batch_size: int = 0          # Triton's dynamic_batching: an idle engine waits for this many
                                          # waiting requests (0: max_num_seqs) ...
    batch_timeout_s: float = 0.0           # ... at most this long after the oldest arrived
                                          # (max_queue_delay_microseconds / 1e6); 0: never waits
    seed: int | None = None               # draws the seeds of requests that bring none; None: each such
                                          # request gets fresh OS entropy (as it must across workers)
    kv_pin_ttl_s: float = 30.0            # prefill-only KV is freed this long after pinning if not released
    kv_host_budget_bytes: int | None = None  # host memory for KV arrays; None: 10% of the machine's
                                          # (engine/host_memory.py); cached blocks are evicted past it
    kv_host_bytes: int | None = 0         # the KV host tier's host memory (engine/kv_tier.py); 0: no tier;
                                          # None: 5% of the machine's (engine/host_memory.py; the worker's default)
    cache_chunk_size: int = 256 * 2**20   # KV per host-tier chunk (emulated bytes)
    prefetch_depth: int = 2               # host-tier chunk copies in flight at once
    kv_tier_sync_load: bool = False       # host-tier loads stall the next step (a benchmark baseline)
    enable_lora: bool = False             # serve LoRA adapters (engine/lora_slots.py)
    max_loras: int = 4                    # adapters in device slots at once (a step mixes at most these)
    max_lora_rank: int = 16               # adapters of a higher rank are refused
    max_cpu_loras: int | None = None      # adapters kept loaded in host memory; None: max_loras
    lora_modules: tuple[tuple[str, str], ...] = ()   # (name, directory) served from the start
    runner: str = "model"                 # "cost_only": no weights, no tokenizer, no forward pass — the
                                          # `emulate` profile's step prices only (the simulator's engine)

    def __post_init__(self):
        if self.timing not in TIMING_MODES:
            raise ValueError(f"timing must be one of {TIMING_MODES}, got {self.timing!r}")
        if self.runner not in RUNNERS:
            raise ValueError(f"runner must be one of {RUNNERS}, got {self.runner!r}")
        if self.runner == "cost_only" and not self.emulate:
            raise ValueError("the cost-only runner has no model to read a shape from: name an emulated "
                             "profile (emulate)")
        if not 0.0 < self.memory_fraction <= 1.0:
            raise ValueError(f"memory_fraction must be in (0, 1], got {self.memory_fraction}")
        if self.tensor_parallel < 1:
            raise ValueError(f"tensor_parallel must be at least 1, got {self.tensor_parallel}")
        if self.kv_pin_ttl_s <= 0:
            raise ValueError(f"kv_pin_ttl_s must be positive, got {self.kv_pin_ttl_s}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be at least 0 (0: no cap), got "
                             f"{self.long_prefill_token_threshold}")
        if self.max_num_batched_attention is not None and self.max_num_batched_attention < 0:
            raise ValueError(f"max_num_batched_attention must be at least 0 (0: no limit; None: from the model), got "
                             f"{self.max_num_batched_attention}")
        if self.max_num_partial_prefills < 1:
            raise ValueError(f"max_num_partial_prefills must be at least 1, got {self.max_num_partial_prefills}")
        if self.kv_host_bytes is not None and self.kv_host_bytes < 0:
            raise ValueError(f"kv_host_bytes must be at least 0 (0: no host tier), got {self.kv_host_bytes}")
        if self.cache_chunk_size < 1:
            raise ValueError(f"cache_chunk_size must be positive, got {self.cache_chunk_size}")
        if self.prefetch_depth < 1:
            raise ValueError(f"prefetch_depth must be at least 1, got {self.prefetch_depth}")
        if self.lora_modules and not self.enable_lora:
            raise ValueError("lora_modules needs enable_lora")
        if self.enable_lora and (self.max_loras < 1 or self.max_lora_rank < 1):
            raise ValueError(f"max_loras and max_lora_rank must be at least 1, got {self.max_loras} and "
                             f"{self.max_lora_rank}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras ({self.max_loras})")
        if self.priority_aging_s < 0 or self.batch_timeout_s < 0:
            raise ValueError(f"priority_aging_s and batch_timeout_s must be at least 0 (0: off), got "
                             f"{self.priority_aging_s} and {self.batch_timeout_s}")
        if self.lower_class_prefill_tokens < 0 or self.preferred_batch_size < 0:
            raise ValueError(f"lower_class_prefill_tokens and preferred_batch_size must be at least 0, got "
                             f"{self.lower_class_prefill_tokens} and {self.preferred_batch_size}")
        if self.kv_host_budget_bytes is not None and self.kv_host_budget_bytes < 1:
            raise ValueError(f"kv_host_budget_bytes must be positive, got {self.kv_host_budget_bytes}")
