"""Prometheus metrics of one worker, served on its side port.

Engine load and device telemetry are read at scrape time by `EngineCollector`, so every scrape
sees current numbers; latencies (TTFT, TPOT) and finished requests are recorded by the Generate
handler through `RequestTimer`, measured at the worker (the client sees these plus the network).
The same latencies also go into sliding windows (`recent_ttft`, `recent_tpot`: one TTFT and one
mean TPOT per request) whose p90 the worker reports in its heartbeats.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from mindmotor.common import vllm_metrics as V
from mindmotor.common.metric_children import cache_all
from mindmotor.common.roles import Role
from mindmotor.vocabulary import SUCCESSFUL_FINISHES, FinishReason

from .latency_window import LatencyWindow

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)
KV_TRANSFER_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)

# device snapshot key -> (metric name, help); every sample is labelled `device`.
NPU_GAUGES = {
    "utilization": ("mindmotor_npu_utilization_percent", "Emulated AI-core utilization over the last second"),
    "hbm_used_bytes": ("mindmotor_npu_hbm_used_bytes", "Emulated HBM allocated (weights, KV pool, workspace)"),
    "hbm_total_bytes": ("mindmotor_npu_hbm_total_bytes", "Emulated HBM capacity"),
    "power_w": ("mindmotor_npu_power_watts", "Emulated board power"),
    "temperature_c": ("mindmotor_npu_temperature_celsius", "Emulated chip temperature"),
}


class EngineCollector(Collector):
    """Engine load and device telemetry, read from the engine at each scrape."""

    def __init__(self, engine, admission, role=lambda: Role.MIXED, model_name: str = ""):
        self.engine = engine
        self.admission = admission
        self.role = role
        self.model_name = model_name

    def collect(self):
        stats = self.engine.stats()
        role = GaugeMetricFamily("mindmotor_worker_role", "1 for the role this worker serves as", labels=["role"])
        for name in Role:
            role.add_metric([name], 1.0 if self.role() == name else 0.0)
        yield role
        yield _gauge("mindmotor_kv_pinned_requests", "Prefilled requests whose KV waits for a decode instance",
                     stats.num_pinned)
        yield _gauge("mindmotor_kv_pinned_blocks", "KV blocks pinned for decode instances", stats.num_pinned_blocks)
        yield _gauge("mindmotor_num_requests_running", "Requests being computed", stats.num_running)
        yield _gauge("mindmotor_num_requests_waiting", "Requests queued for their first step", stats.num_waiting)
        yield _gauge("mindmotor_num_requests_in_flight", "Generate calls not yet finished",
                     len(self.admission.in_flight))
        yield _gauge("mindmotor_worker_draining", "1 while the worker refuses new requests",
                     0 if self.admission.accepting else 1)
        yield _gauge("mindmotor_kv_cache_usage_ratio", "Fraction of KV blocks referenced by requests",
                     stats.kv_usage)
        yield _gauge("mindmotor_kv_cache_blocks", "KV blocks in the pool", stats.num_blocks)
        yield _gauge("mindmotor_kv_host_bytes", "Host memory of the KV arrays", stats.kv_host_bytes)
        yield _gauge("mindmotor_kv_host_budget_bytes", "Host memory budget of the KV arrays",
                     stats.kv_host_budget_bytes)
        yield _gauge("mindmotor_kv_host_blocks", "KV blocks the host budget holds", stats.kv_host_blocks)
        yield _gauge("mindmotor_kv_cached_blocks", "Prefix-cache blocks no request references",
                     stats.kv_cached_blocks)
        yield _counter("mindmotor_kv_evictions", "Cached KV blocks evicted for new ones", stats.kv_evictions)
        yield _counter("mindmotor_kv_host_limited", "KV allocations refused because the host budget, not the "
                       "emulated card, was full", stats.kv_host_limited)
        yield _gauge("mindmotor_prefix_cache_hit_rate", "Prefix-cache block hits over queries",
                     stats.prefix_hit_rate)
        yield _counter("mindmotor_num_preemptions", "Sequences preempted for KV blocks", stats.num_preemptions)
        yield _counter("mindmotor_prompt_tokens", "Prompt tokens computed (cache hits excluded)",
                       stats.prompt_tokens)
        yield _counter("mindmotor_generation_tokens", "Tokens generated", stats.generation_tokens)
        yield _counter("mindmotor_engine_steps", "Engine steps run", stats.steps)
        yield _counter("mindmotor_engine_request_failures", "Requests the engine finished with an error "
                       "(it raised for them; the others went on)", stats.request_failures)
        yield _counter("mindmotor_engine_step_failures", "Engine steps that failed as a whole", stats.step_failures)
        yield _counter("mindmotor_emulated_busy_seconds", "Emulated device time of all steps",
                       stats.emulated_time_s)
        yield _counter("mindmotor_host_lag_seconds", "Host time beyond the emulated time (host-bound steps)",
                       stats.lag_time_s)
        yield from _tier_metrics(stats)
        yield from _npu_gauges(self.engine.device_snapshot())
        yield from self._vllm(stats)
        if stats.lora is not None:
            yield from _lora(stats.lora)

    def _vllm(self, stats):
        """The same load under vLLM's names (see `common.vllm_metrics`)."""
        m = [self.model_name]
        for name, doc, value, kind in (
                (V.NUM_REQUESTS_RUNNING, "Requests being computed", stats.num_running, GaugeMetricFamily),
                (V.NUM_REQUESTS_WAITING, "Requests waiting", stats.num_waiting, GaugeMetricFamily),
                (V.KV_CACHE_USAGE_PERC, "KV-cache usage; 1 means 100 percent", stats.kv_usage, GaugeMetricFamily),
                (V.PREFIX_CACHE_QUERIES, "Prefix-cache queries, in tokens", getattr(stats, "prefix_queries", 0),
                 CounterMetricFamily),
                (V.PREFIX_CACHE_HITS, "Prefix-cache hits, in tokens", getattr(stats, "prefix_hits", 0),
                 CounterMetricFamily),
                (V.EXTERNAL_PREFIX_CACHE_QUERIES, "KV host tier queries, in tokens (after the HBM prefix "
                 "cache's hits)", getattr(stats, "kv_tier_queries", 0), CounterMetricFamily),
                (V.EXTERNAL_PREFIX_CACHE_HITS, "KV host tier hits, in tokens", getattr(stats, "kv_tier_hits", 0),
                 CounterMetricFamily),
                (V.NUM_PREEMPTIONS, "Cumulative number of preemptions", stats.num_preemptions, CounterMetricFamily),
                (V.PROMPT_TOKENS, "Prefill tokens processed", stats.prompt_tokens, CounterMetricFamily),
                (V.GENERATION_TOKENS, "Generation tokens processed", stats.generation_tokens, CounterMetricFamily)):
            family = kind(name, doc, labels=[V.LABEL])
            family.add_metric(m, value)
            yield family
        if stats.iteration_tokens is not None:
            steps = HistogramMetricFamily(V.ITERATION_TOKENS, "Histogram of number of tokens per engine_step.",
                                          labels=[V.LABEL])
            steps.add_metric(m, stats.iteration_tokens.cumulative(), sum_value=stats.iteration_tokens.total)
            yield steps
        info = GaugeMetricFamily(V.CACHE_CONFIG_INFO, "Information of the LLMEngine CacheConfig",
                                 labels=[V.LABEL, "block_size", "num_gpu_blocks"])
        info.add_metric(m + [str(self.engine.info.block_size), str(stats.num_blocks)], 1.0)
        yield info


def _lora(lora: dict):
    """vLLM's `lora_requests_info` (the adapters of running and waiting requests, comma-separated,
    and max_lora as labels; the value is the time of the scrape, as vLLM's) and per-adapter counters."""
    info = GaugeMetricFamily(V.LORA_REQUESTS_INFO, "Running stats on LoRA requests",
                             labels=["running_lora_adapters", "waiting_lora_adapters", "max_lora"])
    info.add_metric([",".join(lora["running_lora_adapters"]), ",".join(lora["waiting_lora_adapters"]),
                     str(lora["max_lora"])], time.time())
    yield info
    requests = CounterMetricFamily("mindmotor_lora_requests", "Requests admitted per LoRA adapter",
                                   labels=["lora_name"])
    for name, count in sorted(lora["requests"].items()):
        requests.add_metric([name], count)
    yield requests
    yield _counter("mindmotor_lora_slot_loads", "LoRA adapters copied into a device slot", lora["loads"])
    yield _counter("mindmotor_lora_slot_load_seconds", "Emulated host-link time of those copies", lora["load_s"])


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


def _tier_metrics(stats):
    """The KV host tier (engine/kv_tier.py): usage, traffic, loads and their emulated duration."""
    from mindmotor.engine.kv_tier import LOAD_TIME_BUCKETS

    yield _gauge("mindmotor_kv_tier_bytes", "Host memory the KV host tier holds", stats.kv_tier_bytes)
    yield _gauge("mindmotor_kv_tier_budget_bytes", "The KV host tier's budget (--kv-host-bytes)",
                 stats.kv_tier_budget_bytes)
    yield _gauge("mindmotor_kv_tier_usage_ratio", "KV host tier bytes over its budget",
                 stats.kv_tier_bytes / stats.kv_tier_budget_bytes if stats.kv_tier_budget_bytes else 0.0)
    yield _gauge("mindmotor_kv_tier_blocks", "KV blocks in the host tier", stats.kv_tier_blocks)
    yield _gauge("mindmotor_kv_tier_loading_requests", "Requests waiting for their prefix from the host tier",
                 stats.kv_tier_loading)
    yield _counter("mindmotor_kv_tier_queries", "Tokens looked up in the host tier", stats.kv_tier_queries)
    yield _counter("mindmotor_kv_tier_hits", "Tokens loaded from the host tier", stats.kv_tier_hits)
    yield _counter("mindmotor_kv_tier_stored_bytes", "Emulated KV bytes copied card to host",
                   stats.kv_tier_bytes_stored)
    yield _counter("mindmotor_kv_tier_loaded_bytes", "Emulated KV bytes copied host to card",
                   stats.kv_tier_bytes_loaded)
    loads = CounterMetricFamily("mindmotor_kv_tier_loads", "Host-tier loads by outcome", labels=["outcome"])
    loads.add_metric(["partial"], stats.kv_tier_loads_partial)
    loads.add_metric(["failed"], stats.kv_tier_loads_failed)
    loads.add_metric(["whole"], max(0, stats.kv_tier_loads - stats.kv_tier_loads_partial
                                    - stats.kv_tier_loads_failed))
    yield loads
    hist = HistogramMetricFamily("mindmotor_kv_tier_load_seconds", "Emulated host-link time of host-tier loads")
    counts = stats.kv_tier_load_buckets or (0,) * len(LOAD_TIME_BUCKETS)
    cumulative, buckets = 0, []
    for bound, n in zip(LOAD_TIME_BUCKETS, counts):
        cumulative += n
        buckets.append((repr(bound), cumulative))
    buckets.append(("+Inf", stats.kv_tier_loads))
    hist.add_metric([], buckets, sum_value=stats.kv_tier_load_s_sum)
    yield hist


def _npu_gauges(snapshot: dict):
    for key, (name, documentation) in NPU_GAUGES.items():
        family = GaugeMetricFamily(name, documentation, labels=["device"])
        family.add_metric([str(snapshot.get("device", ""))], float(snapshot.get(key, 0.0)))
        yield family


class WorkerMetrics:
    """The worker's registry: the scrape-time collector plus per-request latencies and outcomes."""

    def __init__(self, engine, admission, role=lambda: Role.MIXED, model_name: str = ""):
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.collector = EngineCollector(engine, admission, role, model_name)
        self.registry.register(self.collector)
        self.ttft = Histogram("mindmotor_time_to_first_token_seconds",
                              "From Generate start to the first token, at the worker",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.tpot = Histogram("mindmotor_time_per_output_token_seconds",
                              "Between consecutive tokens of one request, at the worker",
                              buckets=TPOT_BUCKETS, registry=self.registry)
        self.requests = Counter("mindmotor_requests", "Finished Generate calls by finish reason",
                                ["finish_reason"], registry=self.registry)
        self.kv_transfer_seconds = Histogram(
            "mindmotor_kv_transfer_seconds", "Emulated time of each KV pull from a prefill instance "
            "(alpha + bytes / (eta * link bandwidth))", ["link"], buckets=KV_TRANSFER_BUCKETS,
            registry=self.registry)
        self.kv_transfer_bytes = Counter("mindmotor_kv_transfer_bytes",
                                         "Emulated KV bytes pulled from prefill instances", ["link"],
                                         registry=self.registry)
        self.kv_transfers = Counter("mindmotor_kv_transfers", "Remote-prefilled requests by outcome "
                                    "(pulled, or fallback: prefilled here)", ["outcome"], registry=self.registry)
        self.kv_shared_blocks = Counter("mindmotor_kv_shared_blocks", "KV blocks through the shared tier's "
                                        "Redis (published, fetched)", ["direction"], registry=self.registry)
        self.kv_shared_errors = Counter("mindmotor_kv_shared_errors", "Failed calls to the shared tier's Redis "
                                        "(Redis is then left alone for a while)", registry=self.registry)
        self.role_switches = Counter("mindmotor_role_switches", "Role changes (SetRole)", ["role"],
                                     registry=self.registry)
        self.refused = Counter("mindmotor_requests_refused", "Generate and Prefill calls refused before the "
                               "engine: invalid_argument, busy (the concurrency limit), engine_dead", ["reason"],
                               registry=self.registry)
        self.keepalives = Counter("mindmotor_stream_keepalives", "Keepalive messages sent on Generate streams "
                                  "silent for --stream-keepalive (queued or computing)", registry=self.registry)
        self.recent_ttft = LatencyWindow()
        self.recent_tpot = LatencyWindow()
        # vLLM's names and buckets (common/vllm_metrics.py), measured as ours above
        self.vllm_ttft = Histogram(V.TTFT, "Time to first token in seconds", [V.LABEL],
                                   buckets=V.TTFT_BUCKETS, registry=self.registry)
        self.vllm_tpot = Histogram(V.TPOT, "Time per output token in seconds", [V.LABEL],
                                   buckets=V.TPOT_BUCKETS, registry=self.registry)
        self.vllm_itl = Histogram(V.INTER_TOKEN, "Inter-token latency in seconds", [V.LABEL],
                                  buckets=V.TPOT_BUCKETS, registry=self.registry)
        self.vllm_e2e = Histogram(V.E2E, "End-to-end request latency in seconds", [V.LABEL],
                                  buckets=V.E2E_BUCKETS, registry=self.registry)
        self.vllm_success = Counter(V.REQUEST_SUCCESS, "Finished requests by finish reason",
                                    [V.LABEL, "finished_reason"], registry=self.registry)
        self.vllm_phases = {name: Histogram(name, doc, [V.LABEL], buckets=V.REQUEST_LATENCY_BUCKETS,
                                            registry=self.registry)
                            for name, doc in PHASE_DOCS.items()}
        cache_all(self.requests, self.kv_transfers, self.kv_shared_blocks, self.role_switches, self.refused,
                  self.vllm_ttft, self.vllm_tpot, self.vllm_itl, self.vllm_e2e, self.vllm_success,
                  *self.vllm_phases.values())

    def request_timer(self) -> "RequestTimer":
        return RequestTimer(self)

    def serve(self, host: str, port: int):
        """Start the /metrics HTTP server on a daemon thread; returns (server, bound port)."""
        from mindmotor.common.https_side import serve_metrics

        return serve_metrics(host, port, self.registry)


PHASE_DOCS = {
    V.QUEUE_TIME: "Histogram of time spent in WAITING phase for request.",
    V.PREFILL_TIME: "Histogram of time spent in PREFILL phase for request.",
    V.DECODE_TIME: "Histogram of time spent in DECODE phase for request.",
    V.INFERENCE_TIME: "Histogram of time spent in RUNNING phase for request.",
}


class RequestTimer:
    """TTFT and TPOT of one Generate call, and its phases (`timings`)."""

    def __init__(self, metrics: WorkerMetrics):
        self.metrics = metrics
        self.started = time.monotonic()
        self.ttft_s: float | None = None
        self._first_token_at: float | None = None
        self._last_token_at: float | None = None
        self._tokens = 0

    def on_tokens(self, count: int) -> None:
        if count == 0:
            return
        now = time.monotonic()
        if self._last_token_at is None:
            self.ttft_s = now - self.started
            self.metrics.ttft.observe(self.ttft_s)
            self.metrics.vllm_ttft.labels(self.metrics.model_name).observe(self.ttft_s)
            self.metrics.recent_ttft.add(self.ttft_s)
            self._first_token_at = now
            count -= 1
        else:
            gap = (now - self._last_token_at) / count
            tpot, itl = self.metrics.vllm_tpot.labels(self.metrics.model_name), \
                self.metrics.vllm_itl.labels(self.metrics.model_name)
            for _ in range(count):
                self.metrics.tpot.observe(gap)
                tpot.observe(gap)
                itl.observe(gap)
        self._tokens += count
        self._last_token_at = now

    def on_finish(self, finish_reason: FinishReason) -> None:
        self.metrics.requests.labels(finish_reason=finish_reason).inc()
        if finish_reason in SUCCESSFUL_FINISHES:
            self.metrics.vllm_success.labels(self.metrics.model_name, finish_reason).inc()
        e2e = self._last_token_at - self.started if self._last_token_at is not None else self.elapsed_s
        self.metrics.vllm_e2e.labels(self.metrics.model_name).observe(e2e)     # to the last token
        if self._tokens > 0:                 # the request's mean time per output token
            self.metrics.recent_tpot.add((self._last_token_at - self._first_token_at) / self._tokens)

    def timings(self, out):
        """The finished call's phases (`RequestTimings`, sent on its last message), recorded under
        vLLM's names here too."""
        from mindmotor.worker.convert import request_timings

        t = request_timings(out, self.started, self._last_token_at or time.monotonic())
        name = self.metrics.model_name
        for metric, value in ((V.QUEUE_TIME, t.queued_s), (V.PREFILL_TIME, t.prefill_s),
                              (V.DECODE_TIME, t.decode_s), (V.INFERENCE_TIME, t.prefill_s + t.decode_s)):
            self.metrics.vllm_phases[metric].labels(name).observe(value)
        return t

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started
