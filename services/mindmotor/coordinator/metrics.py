"""The coordinator's Prometheus metrics, in a registry of its own (served at GET /metrics)."""

from __future__ import annotations

import os
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from mindmotor.common.metric_children import cache_children

from mindmotor.common import vllm_metrics as V
from mindmotor.common.latency_phases import CLASS_LABEL, PHASE_LABEL, PHASE_METRIC

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120)
TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


class CoordinatorMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        p = "mindmotor_coordinator_"
        self.requests = Counter(p + "requests_total", "HTTP requests by endpoint, model and status",
                                ["endpoint", "model", "status"], registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "from arrival to the first token",
                              ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(p + "inter_token_latency_seconds", "between two chunks of tokens of a choice",
                             ["model"], buckets=TOKEN_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(p + "time_per_output_token_seconds", "(e2e - ttft) / (tokens - 1) per choice",
                              ["model"], buckets=TOKEN_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "from arrival to the last token of a choice",
                             ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.outstanding = Gauge(p + "outstanding_requests", "admitted choices not yet finished (queue size)",
                                 ["model"], registry=r, multiprocess_mode="livesum")
        self.rejected = Counter(p + "rejected_total", "requests refused before routing", ["reason"], registry=r)
        self.responses_store_errors = Counter(p + "responses_store_errors_total", "responses (/v1/responses) "
                                              "that could not be stored (served, marked store false)", registry=r)
        self.api_key_reloads = Counter(p + "api_key_reloads_total", "changes of the API key file: reloaded, or "
                                       "kept (unreadable or empty: the previous keys stay)", ["outcome"], registry=r)
        self.retries = Counter(p + "retries_total", "resubmissions after a worker failure",
                               ["model", "reason"], registry=r)
        self.migrations = Counter(p + "migrations_total",
                                  "resubmissions that carried already produced tokens", ["model"], registry=r)
        self.stream_stalls = Counter(p + "stream_stalls_total", "worker calls given up as silent: for "
                                     "stream_progress_timeout_s (cause=deadline), or for failed_instance_silence_s "
                                     "on an instance the routing table says failed (cause=routing_table)",
                                     ["model", "cause"], registry=r)
        self.routed = Counter(p + "routed_total", "worker requests sent, per instance",
                              ["model", "instance_id"], registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens_total", "", ["model"], registry=r)
        self.generation_tokens = Counter(p + "generation_tokens_total", "", ["model"], registry=r)
        self.pd_prefills = Counter(p + "pd_prefills_total", "choices whose prompt ran on a prefill instance",
                                   ["model"], registry=r)
        self.pd_fallbacks = Counter(p + "pd_fallbacks_total", "choices that left the prefill/decode split, "
                                    "by reason", ["model", "reason"], registry=r)
        self.rate_limit_fail_open = Counter(p + "rate_limit_fail_open_total", "requests let through unlimited "
                                            "because the rate limit store failed (error) or was being skipped "
                                            "after a failure (skipped)", ["reason"], registry=r)
        self.http_refused = Counter(p + "http_refused_total", "connections cut off: header_timeout, "
                                    "body_timeout (408), too_many_connections (503), ambiguous_framing or "
                                    "invalid_request (400)", ["reason"], registry=r)
        self.instances = Gauge(p + "routable_instances", "routable instances per model", ["model"], registry=r,
                               multiprocess_mode="livemax")
        self.stream_resumes = Counter(p + "stream_resumes_total", "streams resumed from a Last-Event-ID, by outcome: "
                                      "resumed, invalid (forged, malformed, another request), not_resumable (the "
                                      "worker no longer has the output)", ["outcome"], registry=r)
        self.loop_lag = Histogram(p + "event_loop_lag_seconds", "how late the event loop ran a timer (a loop "
                                  "busy with one request's work delays every other request by this much)",
                                  buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
                                  registry=r)
        self.model_discovery = Counter(p + "model_discovery_total", "ModelInfo outcomes of model discovery: "
                                       "discovered, matched, version_tokenizer, conflict, local_differs, failed, "
                                       "forgotten",
                                       ["model", "outcome"], registry=r)

        # Per deployment version (canary analysis reads these: deployer/coordinator_metrics.py). A
        # request counts for the version of the instance that served its first choice; an error is
        # a request that was routed and then failed (any status, or an error event in a stream). A
        # LoRA adapter's requests count under their base model and under the adapter's name too.
        per_version = ["model", "version"]
        self.version_requests = Counter(p + "version_requests", "generation requests routed, per model version",
                                        per_version, registry=r)
        self.version_errors = Counter(p + "version_errors", "routed generation requests that failed, per model "
                                      "version", per_version, registry=r)
        self.version_ttft = Histogram(p + "version_time_to_first_token_seconds", "from arrival to the first "
                                      "token, per model version", per_version, buckets=LATENCY_BUCKETS, registry=r)

        # vLLM's names, buckets and `model_name` label (common/vllm_metrics.py), beside ours
        self.vllm_ttft = Histogram(V.TTFT, "Time to first token in seconds", [V.LABEL], buckets=V.TTFT_BUCKETS,
                                   registry=r)
        self.vllm_tpot = Histogram(V.TPOT, "Time per output token in seconds", [V.LABEL], buckets=V.TPOT_BUCKETS,
                                   registry=r)
        self.vllm_itl = Histogram(V.INTER_TOKEN, "Inter-token latency in seconds", [V.LABEL],
                                  buckets=V.TPOT_BUCKETS, registry=r)
        self.vllm_e2e = Histogram(V.E2E, "End-to-end request latency in seconds", [V.LABEL], buckets=V.E2E_BUCKETS,
                                  registry=r)
        self.vllm_running = Gauge(V.NUM_REQUESTS_RUNNING, "Requests in model execution batches (summed over the "
                                  "model's instances, as they last reported)", [V.LABEL], registry=r,
                                  multiprocess_mode="mostrecent")
        self.vllm_generation_tokens = Counter(V.GENERATION_TOKENS, "Generation tokens", [V.LABEL], registry=r)
        self.vllm_prompt_tokens = Counter(V.PROMPT_TOKENS, "Prompt tokens of finished requests (cached included)",
                                          [V.LABEL], registry=r)
        self.vllm_success = Counter(V.REQUEST_SUCCESS, "Count of successfully processed requests.",
                                    [V.LABEL, "finished_reason"], registry=r)
        self.vllm_preemptions = Counter(V.NUM_PREEMPTIONS, "Cumulative number of preemption from the engine.",
                                        [V.LABEL], registry=r)
        self.vllm_prefix_queries = Counter(V.PREFIX_CACHE_QUERIES, "Prefix cache queries, in terms of number of "
                                           "queried tokens.", [V.LABEL], registry=r)
        self.vllm_prefix_hits = Counter(V.PREFIX_CACHE_HITS, "Prefix cache hits, in terms of number of cached "
                                        "tokens.", [V.LABEL], registry=r)
        self.vllm_phases = {name: Histogram(name, doc, [V.LABEL], buckets=V.REQUEST_LATENCY_BUCKETS, registry=r)
                            for name, doc in PHASE_DOCS.items()}
        # from the routing table at each scrape (the instances' last reports), summed per model
        self.vllm_waiting = Gauge(V.NUM_REQUESTS_WAITING, "Requests waiting: in the instances' queues, and "
                                  "admitted here but not yet sent", [V.LABEL], registry=r,
                                  multiprocess_mode="mostrecent")
        self.vllm_kv_usage = Gauge(V.KV_CACHE_USAGE_PERC, "KV-cache usage. 1 means 100 percent usage (the mean "
                                   "over the model's instances)", [V.LABEL], registry=r, multiprocess_mode="mostrecent")
        self.vllm_cache_config = Gauge(V.CACHE_CONFIG_INFO, "Information of the LLMEngine CacheConfig (per "
                                       "instance: engine)", [V.LABEL, V.ENGINE_LABEL, "block_size"], registry=r,
                                       multiprocess_mode="mostrecent")
        # MindMotor's own: the coordinator's queue, and where each request's time went (analyze latency)
        self.pending = Gauge("mindmotor_pending_queue_size", "Admitted choices without their first token yet "
                             "(waiting here, in a worker's queue or in prefill), per class", ["class"],
                             registry=r, multiprocess_mode="livesum")
        self.slo = Counter("mindmotor_slo_requests", "Finished choices of a class with TTFT / TPOT targets: met, "
                           "missed_ttft, missed_tpot or missed_both", [V.LABEL, CLASS_LABEL, "outcome"], registry=r)
        self.phase = Histogram(PHASE_METRIC, "Where a finished request's time went, per "
                               "phase: coordinator (arrival to its last worker call: admission, routing, earlier "
                               "attempts, a remote prefill), worker_queue, prefill, decode (the worker's own "
                               "clock), network (the rest of the worker call)", [V.LABEL, CLASS_LABEL, PHASE_LABEL],
                               buckets=V.REQUEST_LATENCY_BUCKETS, registry=r)
        self.engine_steps = EngineSteps()          # vllm:iteration_tokens_total, from the routing table
        r.register(self.engine_steps)
        for metric in [*vars(self).values(), *self.vllm_phases.values()]:
            if isinstance(metric, (Counter, Gauge, Histogram)) and metric is not self.vllm_cache_config:
                cache_children(metric)          # cleared at each refresh: its children are not kept

    def refresh_engines(self, models: dict) -> None:
        """vLLM's engine gauges from the routing table (`models`: model -> its instances, as they
        last reported): running and waiting summed over a model's instances, KV usage their mean,
        cache_config_info one series per instance (label engine)."""
        for model, views in models.items():
            if not model:
                continue
            self.vllm_running.labels(model).set(sum(v.running for v in views))
            self.vllm_waiting.labels(model).set(sum(v.waiting for v in views))
            self.vllm_kv_usage.labels(model).set(sum(v.kv_usage for v in views) / len(views) if views else 0.0)
        self.vllm_cache_config.clear()
        for model, views in models.items():
            for v in views:
                if model:
                    self.vllm_cache_config.labels(model, v.instance_id, str(v.block_size)).set(1)
        self.engine_steps.models = models

    def render(self) -> bytes:
        """This process's metrics; under `mindmotor up`, whose coordinator replicas share one port,
        every replica's (`PROMETHEUS_MULTIPROC_DIR`, prometheus_client's multiprocess mode: counters
        and histograms summed over the replicas, dead ones included, so they never go down;
        gauges summed or maxed over the live ones)."""
        if os.environ.get(MULTIPROC_ENV):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            registry.register(self.engine_steps)     # the routing table's: this replica's view, once
            return generate_latest(registry)
        return generate_latest(self.registry)


class EngineSteps(Collector):
    """vLLM's `iteration_tokens_total` per instance (label engine), as each last reported it (a
    worker's cumulative counts since it started, in heartbeats or Status: not a sum over
    coordinators or replicas, so it is read from the routing table at the scrape)."""

    def __init__(self):
        self.models: dict = {}

    def collect(self):
        family = HistogramMetricFamily(V.ITERATION_TOKENS, "Histogram of number of tokens per engine_step.",
                                       labels=[V.LABEL, V.ENGINE_LABEL])
        for model, views in self.models.items():
            for v in views:
                if model and len(v.iteration_token_counts) == len(V.ITERATION_TOKEN_BUCKETS) + 1:
                    counts = V.BucketCounts(V.ITERATION_TOKEN_BUCKETS, list(v.iteration_token_counts),
                                            v.iteration_tokens_sum)
                    family.add_metric([model, v.instance_id], counts.cumulative(), sum_value=v.iteration_tokens_sum)
        yield family


def forget_replica(directory: str, pid: int) -> None:
    """A dead replica's live gauges leave the sums (its counters stay: totals never go down)."""
    multiprocess.mark_process_dead(pid, str(directory))


PHASE_DOCS = {
    V.QUEUE_TIME: "Histogram of time spent in WAITING phase for request.",
    V.PREFILL_TIME: "Histogram of time spent in PREFILL phase for request.",
    V.DECODE_TIME: "Histogram of time spent in DECODE phase for request.",
    V.INFERENCE_TIME: "Histogram of time spent in RUNNING phase for request.",
}


class ChoiceTimer:
    """Latency of one choice: TTFT, the gaps between chunks, TPOT and end to end; at its finish,
    vLLM's request counters and phase histograms (`finish`)."""

    def __init__(self, metrics: CoordinatorMetrics, model: str, arrival: float, slo_class: str = "standard",
                 targets=None):
        """`targets`: the class's (slo_classes.SLOClass: ttft_s, tpot_s), counted as met or missed."""
        self.metrics = metrics
        self.model = model
        self.arrival = arrival
        self.slo_class = slo_class
        self.targets = targets
        self.first: float | None = None
        self.last: float | None = None
        self.tokens = 0
        self.call_started: float | None = None    # when the last worker call was sent
        self._pending = False

    def begin(self) -> None:
        """The choice is admitted and on its way: pending until its first token (or its end)."""
        if not self._pending and self.first is None:
            self._pending = True
            self.metrics.pending.labels(self.slo_class).inc()

    def end(self) -> None:
        if self._pending:
            self._pending = False
            self.metrics.pending.labels(self.slo_class).dec()

    def on_call(self) -> None:
        self.call_started = time.perf_counter()

    def on_tokens(self, n: int) -> None:
        if n <= 0:
            return
        now = time.perf_counter()
        if self.first is None:
            self.first = now
            self.end()
            self.metrics.ttft.labels(self.model).observe(now - self.arrival)
            self.metrics.vllm_ttft.labels(self.model).observe(now - self.arrival)
        elif self.last is not None:
            self.metrics.itl.labels(self.model).observe(now - self.last)
            self.metrics.vllm_itl.labels(self.model).observe(now - self.last)
        self.last = now
        self.tokens += n

    def on_whole(self, n: int, timings=None) -> None:
        """A choice's tokens in one answer (a unary worker call: a non-streamed request): its first
        token's time is the call's start plus the worker's queue and prefill (`RequestTimings`;
        without them, now), the gaps between its tokens the worker's decode time shared evenly."""
        if n <= 0:
            return
        now = time.perf_counter()
        gaps = n - 1
        if self.first is None:
            first = now
            if timings is not None and self.call_started is not None:
                first = min(now, self.call_started + timings.queued_s + timings.prefill_s)
            self.first = first
            self.end()
            self.metrics.ttft.labels(self.model).observe(first - self.arrival)
            self.metrics.vllm_ttft.labels(self.model).observe(first - self.arrival)
        else:
            gaps = n                            # after a first answer (a remote prefill): every token
        if gaps > 0:
            gap = (timings.decode_s / gaps) if timings is not None else (now - self.first) / gaps
            itl, vllm_itl = self.metrics.itl.labels(self.model), self.metrics.vllm_itl.labels(self.model)
            for _ in range(gaps):
                itl.observe(gap)
                vllm_itl.observe(gap)
        self.last = now
        self.tokens += n

    def on_finish(self, finish_reason: str = "", usage=None, timings=None) -> None:
        """The choice finished (`finish_reason`, its `usage`, the last worker call's
        `RequestTimings` if any): every vLLM request family moves by one. vLLM's phases here: prefill
        and decode as the worker measured them, queue the rest of e2e (everything before the engine's
        first step: admission, routing, network, the worker's queue), so queue + prefill + decode = e2e."""
        now = time.perf_counter()
        self.end()
        e2e = now - self.arrival
        self.metrics.e2e.labels(self.model).observe(e2e)
        self.metrics.vllm_e2e.labels(self.model).observe(e2e)
        m = self.model
        if finish_reason:
            self.metrics.vllm_success.labels(m, finish_reason).inc()
        if usage is not None:
            self.metrics.vllm_prompt_tokens.labels(m).inc(usage.prompt_tokens)
            self.metrics.vllm_prefix_queries.labels(m).inc(usage.prompt_tokens)
            self.metrics.vllm_prefix_hits.labels(m).inc(usage.cached_tokens)
        self._phases(e2e, now, timings)
        self._slo(now)

    def _slo(self, now: float) -> None:
        t = self.targets
        if t is None or (t.ttft_s is None and t.tpot_s is None):
            return
        ttft = (self.first if self.first is not None else now) - self.arrival
        tpot = (now - self.first) / (self.tokens - 1) if self.first is not None and self.tokens > 1 else 0.0
        late_ttft = t.ttft_s is not None and ttft > t.ttft_s
        late_tpot = t.tpot_s is not None and tpot > t.tpot_s
        outcome = "missed_both" if late_ttft and late_tpot else "missed_ttft" if late_ttft else \
            "missed_tpot" if late_tpot else "met"
        self.metrics.slo.labels(self.model, self.slo_class, outcome).inc()
        self.metrics.generation_tokens.labels(self.model).inc(self.tokens)
        self.metrics.vllm_generation_tokens.labels(self.model).inc(self.tokens)
        if self.first is not None and self.tokens > 1:
            self.metrics.tpot.labels(self.model).observe((now - self.first) / (self.tokens - 1))
            self.metrics.vllm_tpot.labels(self.model).observe((now - self.first) / (self.tokens - 1))

    def _phases(self, e2e: float, now: float, timings) -> None:
        worker_queue = prefill = decode = 0.0
        if timings is not None:
            worker_queue, prefill, decode = timings.queued_s, timings.prefill_s, timings.decode_s
            self.metrics.vllm_preemptions.labels(self.model).inc(timings.preemptions)
        # never more than e2e (clocks differ: the worker's durations against ours)
        running = min(prefill + decode, e2e)
        prefill = min(prefill, running)
        decode = running - prefill
        queue = e2e - running
        phases = self.metrics.vllm_phases
        for name, value in ((V.QUEUE_TIME, queue), (V.PREFILL_TIME, prefill), (V.DECODE_TIME, decode),
                            (V.INFERENCE_TIME, running)):
            phases[name].labels(self.model).observe(value)
        call = now - self.call_started if self.call_started is not None and timings is not None else 0.0
        call = min(call, e2e)
        worker_queue = min(worker_queue, max(0.0, call - running))
        mine = {"coordinator": e2e - call, "worker_queue": worker_queue, "prefill": prefill, "decode": decode,
                "network": max(0.0, call - running - worker_queue)}
        for phase, value in mine.items():
            self.metrics.phase.labels(self.model, self.slo_class, phase).observe(value)
