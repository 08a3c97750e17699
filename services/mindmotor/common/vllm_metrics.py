"""vLLM's metric names and histogram buckets, shared by the workers and the coordinator, so that
what reads vLLM's `/metrics` (a vLLM Grafana dashboard, the production-stack router, an llm-d
endpoint picker) reads ours too. Every family carries the `model_name` label, as vLLM's do."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

PREFIX = "vllm:"
LABEL = "model_name"

# vLLM's (V1) bucket boundaries
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
# vLLM's request_latency_buckets: e2e, queue, prefill, decode and inference times share them
REQUEST_LATENCY_BUCKETS = E2E_BUCKETS
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

NUM_REQUESTS_RUNNING = PREFIX + "num_requests_running"
NUM_REQUESTS_WAITING = PREFIX + "num_requests_waiting"
KV_CACHE_USAGE_PERC = PREFIX + "kv_cache_usage_perc"
PREFIX_CACHE_QUERIES = PREFIX + "prefix_cache_queries"      # counters (tokens): stored with _total
PREFIX_CACHE_HITS = PREFIX + "prefix_cache_hits"
# vLLM's names for a KV connector's cache (here: the KV host tier), counters in tokens
EXTERNAL_PREFIX_CACHE_QUERIES = PREFIX + "external_prefix_cache_queries"
EXTERNAL_PREFIX_CACHE_HITS = PREFIX + "external_prefix_cache_hits"
NUM_PREEMPTIONS = PREFIX + "num_preemptions"
PROMPT_TOKENS = PREFIX + "prompt_tokens"
GENERATION_TOKENS = PREFIX + "generation_tokens"
REQUEST_SUCCESS = PREFIX + "request_success"                # label finished_reason
TTFT = PREFIX + "time_to_first_token_seconds"
TPOT = PREFIX + "time_per_output_token_seconds"
INTER_TOKEN = PREFIX + "inter_token_latency_seconds"
E2E = PREFIX + "e2e_request_latency_seconds"
LORA_REQUESTS_INFO = PREFIX + "lora_requests_info"         # gauge: labels running/waiting adapters, max_lora
QUEUE_TIME = PREFIX + "request_queue_time_seconds"          # WAITING: arrival to the first step
PREFILL_TIME = PREFIX + "request_prefill_time_seconds"      # the first step to the first token
DECODE_TIME = PREFIX + "request_decode_time_seconds"        # the first token to the last
INFERENCE_TIME = PREFIX + "request_inference_time_seconds"  # RUNNING: prefill + decode
ITERATION_TOKENS = PREFIX + "iteration_tokens_total"        # a histogram (vLLM's name has _total)
CACHE_CONFIG_INFO = PREFIX + "cache_config_info"            # a gauge at 1, the config in its labels
ENGINE_LABEL = "engine"                                     # vLLM's per-engine label: here the instance


@dataclass
class BucketCounts:
    """A histogram's state without a registry (the engine keeps one per engine, the worker
    exports it): counts per bucket (not cumulative, +Inf last), the sum and the count."""
    bounds: tuple = ITERATION_TOKEN_BUCKETS
    counts: list = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self):
        self.counts = self.counts or [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """prometheus_client's HistogramMetricFamily buckets: (le, cumulative count)."""
        out, running = [], 0
        for bound, n in zip(self.bounds, self.counts):
            running += n
            out.append((repr(float(bound)), running))
        out.append(("+Inf", running + self.counts[-1]))   # not self.count: a copy may lag the counts
        return out
