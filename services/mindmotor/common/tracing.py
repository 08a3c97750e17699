"""OpenTelemetry traces, off unless an OTLP endpoint is given (vLLM's `--otlp-traces-endpoint`):
spans exported over OTLP/HTTP (protobuf) in batches, every request sampled (or a parent's
decision), propagated between services with W3C `traceparent` (HTTP headers, gRPC metadata).
Off, `Tracing.enabled` is False and callers skip all span work (one attribute test per request).

The spans are recorded here, not through OpenTelemetry's SDK: a span is a small object whose end
appends it to a queue, and a thread of the service encodes the queue as OTLP protobuf
(`opentelemetry-proto`'s messages, the `tracing` extra) and posts it to the collector — every
`OTEL_BSP_SCHEDULE_DELAY` ms (5000) or as soon as `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (512) spans
wait, at most `OTEL_BSP_MAX_QUEUE_SIZE` (2048) waiting (more are dropped and counted), the SDK's
batch processor's settings and defaults. The SDK's span costs about 80 µs of CPU to make and as
much to encode on a loaded host, which put the 100 %-sampled throughput at 0.8× tracing off
(benchmarks/tracing_overhead.py); this costs about 9 µs to make and 45 µs to encode. What is kept of OpenTelemetry is the wire:
W3C trace context in, OTLP/HTTP out, readable by any collector."""

from __future__ import annotations

import collections
import logging
import os
import random
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar

log = logging.getLogger("mindmotor.tracing")

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
EXPORT_TIMEOUT_S = 10.0          # one OTLP export to the collector (the SDK exporter's default)
SCOPE = "mindmotor"
# the span of the request whose task runs (a worker's Generate call): work done in that task or in
# tasks it starts (the shared KV tier's fetch) records its own span as a child of this one
CURRENT_SPAN: ContextVar["Span | None"] = ContextVar("mindmotor_current_span", default=None)


def wall_ns(reading: float, clock=time.monotonic) -> int:
    """A reading of `clock` (time.monotonic, time.perf_counter) as epoch nanoseconds."""
    return time.time_ns() - int((clock() - reading) * 1e9)


def check_endpoint(endpoint: str | None) -> str | None:
    """ValueError unless `endpoint` is None or an http(s) URL and the OTLP messages are installed."""
    if not endpoint:
        return None
    if not endpoint.startswith(("http://", "https://")):
        raise ValueError(f"otlp traces endpoint {endpoint!r}: an http(s):// URL of an OTLP/HTTP receiver")
    import importlib.util

    if importlib.util.find_spec("opentelemetry.proto") is None:
        raise ValueError("an otlp traces endpoint needs OpenTelemetry's OTLP messages (opentelemetry-proto): "
                         "pip install 'mindmotor[tracing]'")
    return endpoint


class SpanContext:
    """A span's identity as it crosses a process boundary (a parsed traceparent)."""
    __slots__ = ("trace_id", "span_id", "sampled")

    def __init__(self, trace_id: bytes, span_id: bytes, sampled: bool):
        self.trace_id, self.span_id, self.sampled = trace_id, span_id, sampled


class Span:
    """One span: `set_attribute(s)`, `add_event`, `end` (once; later calls do nothing). A span of
    an unsampled trace records nothing but still propagates its context."""
    __slots__ = ("name", "trace_id", "span_id", "parent_id", "start_ns", "end_ns", "attributes", "events",
                 "sampled", "_sink")

    def __init__(self, name, trace_id, span_id, parent_id, start_ns, attributes, sampled, sink):
        self.name, self.trace_id, self.span_id, self.parent_id = name, trace_id, span_id, parent_id
        self.start_ns, self.end_ns = start_ns, 0
        self.attributes = dict(attributes) if attributes else {}
        self.events: list[tuple[str, int]] = []
        self.sampled, self._sink = sampled, sink

    def set_attribute(self, key: str, value) -> None:
        self.attributes[key] = value

    def set_attributes(self, attributes: dict) -> None:
        self.attributes.update(attributes)

    def add_event(self, name: str, timestamp: int | None = None) -> None:
        self.events.append((name, timestamp or time.time_ns()))

    def end(self, end_time: int | None = None) -> None:
        if self.end_ns:
            return
        self.end_ns = end_time or time.time_ns()
        if self.sampled:
            self._sink(self)


class Tracing:
    def __init__(self, service: str, endpoint: str | None = None):
        self.enabled = bool(endpoint)
        self._exporter: _Exporter | None = None
        if not endpoint:
            return
        check_endpoint(endpoint)
        if endpoint.rstrip("/").count("/") == 2:          # host only: OTLP/HTTP's traces path
            endpoint = endpoint.rstrip("/") + "/v1/traces"
        self._exporter = _Exporter(service, endpoint)
        self._random = random.Random()

    @staticmethod
    def extract(carrier) -> SpanContext | None:
        """The remote parent from headers or gRPC metadata (pairs or a mapping); None without a
        valid traceparent."""
        items = carrier.items() if hasattr(carrier, "items") else carrier
        for key, value in items:
            if key.lower() == TRACEPARENT:
                return _parse_traceparent(value)
        return None

    @staticmethod
    def inject(span: Span | None) -> list[tuple[str, str]]:
        """gRPC metadata carrying `span` as the parent (none for None: tracing off)."""
        if span is None:
            return []
        return [(TRACEPARENT, f"00-{span.trace_id.hex()}-{span.span_id.hex()}-{'01' if span.sampled else '00'}")]

    def start(self, name: str, parent=None, start_s: float | None = None, attributes: dict | None = None,
              clock=time.monotonic) -> Span | None:
        """A started span (end it with `.end()`), or None when tracing is off. `parent`: a span or
        an extracted context; `start_s`: its start, a reading of `clock`."""
        if not self.enabled:
            return None
        bits = self._random.getrandbits
        if parent is None:
            trace_id, parent_id, sampled = bits(128).to_bytes(16, "big"), b"", True
        else:
            trace_id, parent_id, sampled = parent.trace_id, parent.span_id, parent.sampled
        start_ns = wall_ns(start_s, clock) if start_s is not None else time.time_ns()
        return Span(name, trace_id, bits(64).to_bytes(8, "big"), parent_id, start_ns, attributes, sampled,
                    self._exporter.add)

    @contextmanager
    def _ended(self, span):
        try:
            yield span
        finally:
            span.end()

    def span(self, name: str, parent=None, start_s: float | None = None, attributes: dict | None = None,
             clock=time.monotonic):
        """`start` as a context manager (nothing when off)."""
        span = self.start(name, parent, start_s, attributes, clock)
        return nullcontext() if span is None else self._ended(span)

    def span_after(self, name: str, parent, start_s: float, end_s: float, attributes: dict | None = None,
                   clock=time.monotonic) -> None:
        """A span that already happened (`start_s`..`end_s`, readings of `clock`), recorded now."""
        span = self.start(name, parent, start_s, attributes, clock)
        if span is not None:
            span.end(wall_ns(end_s, clock))

    def shutdown(self) -> None:
        if self._exporter is not None:
            self._exporter.shutdown()           # exports what is still queued

    @property
    def dropped(self) -> int:
        """Spans dropped because the queue was full (the collector too slow or away)."""
        return self._exporter.dropped if self._exporter is not None else 0


def _parse_traceparent(value: str) -> SpanContext | None:
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff" or len(parts[1]) != 32 or len(parts[2]) != 16 \
            or len(parts[3]) != 2 or (parts[0] == "00" and len(parts) != 4):
        return None
    try:
        trace_id, span_id, flags = bytes.fromhex(parts[1]), bytes.fromhex(parts[2]), int(parts[3], 16)
        bytes.fromhex(parts[0])
    except ValueError:
        return None
    if not any(trace_id) or not any(span_id):
        return None
    return SpanContext(trace_id, span_id, bool(flags & 1))


def _env_int(name: str, default: int) -> int:
    try:
        value = int(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 else default


class _Exporter:
    """Ended spans, queued and posted as OTLP/HTTP protobuf by a daemon thread."""

    def __init__(self, service: str, endpoint: str):
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
        from opentelemetry.proto.common.v1 import common_pb2
        from opentelemetry.proto.trace.v1 import trace_pb2

        self._pb = (trace_service_pb2, common_pb2, trace_pb2)
        self.service, self.endpoint = service, endpoint
        self.delay_s = _env_int("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        self.max_queue = _env_int("OTEL_BSP_MAX_QUEUE_SIZE", 2048)
        self.batch = min(_env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512), self.max_queue)
        self.queue: collections.deque[Span] = collections.deque()
        self.dropped = 0
        self._failures = 0
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="otlp-traces", daemon=True)
        self._thread.start()

    def add(self, span: Span) -> None:
        if len(self.queue) >= self.max_queue:
            self.dropped += 1
            return
        self.queue.append(span)
        if len(self.queue) == self.batch:
            self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.delay_s)
            self._wake.clear()
            self._drain()
        self._drain()

    def _drain(self) -> None:
        while self.queue:
            batch = []
            while self.queue and len(batch) < self.batch:
                batch.append(self.queue.popleft())
            self._post(self._encode(batch))

    def _encode(self, spans: list[Span]) -> bytes:
        trace_service_pb2, common_pb2, trace_pb2 = self._pb
        AnyValue, KeyValue = common_pb2.AnyValue, common_pb2.KeyValue
        request = trace_service_pb2.ExportTraceServiceRequest()
        rs = request.resource_spans.add()
        rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value=self.service)))
        ss = rs.scope_spans.add()
        ss.scope.name = SCOPE
        out = ss.spans
        for s in spans:
            out.append(trace_pb2.Span(
                trace_id=s.trace_id, span_id=s.span_id, parent_span_id=s.parent_id, name=s.name,
                kind=trace_pb2.Span.SPAN_KIND_INTERNAL, start_time_unix_nano=s.start_ns,
                end_time_unix_nano=s.end_ns, attributes=[KeyValue(key=k, value=_any(AnyValue, v))
                                                         for k, v in s.attributes.items()],
                events=[trace_pb2.Span.Event(name=n, time_unix_nano=t) for n, t in s.events]))
        return request.SerializeToString()

    def _post(self, body: bytes) -> None:
        request = urllib.request.Request(self.endpoint, data=body, method="POST",
                                         headers={"Content-Type": "application/x-protobuf"})
        try:
            with urllib.request.urlopen(request, timeout=EXPORT_TIMEOUT_S) as response:
                response.read()
            self._failures = 0
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self._failures += 1
            if self._failures == 1 or self._failures % 100 == 0:
                log.warning("exporting traces failed; the batch is dropped",
                            extra={"endpoint": self.endpoint, "error": str(exc), "failures": self._failures})

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(EXPORT_TIMEOUT_S)


def _any(AnyValue, value):
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=str(value))
