"""OpenTelemetry traces, off unless an OTLP endpoint is given (vLLM's `--otlp-traces-endpoint`):
spans exported over OTLP/HTTP (protobuf) in batches, every request sampled (or a parent's
decision), propagated between services with W3C `traceparent` (HTTP headers, gRPC metadata).
Off, `Tracing.enabled` is False and callers skip all span work (one attribute test per request).
The SDK and the exporter are the `tracing` extra: asking for traces without them is a clear error
at start-up. Each service has its own TracerProvider (none is installed globally)."""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
EXPORT_TIMEOUT_S = 10.0          # one OTLP export to the collector (the exporter's own default, made explicit)


def wall_ns(reading: float, clock=time.monotonic) -> int:
    """A reading of `clock` (time.monotonic, time.perf_counter) as epoch nanoseconds."""
    return time.time_ns() - int((clock() - reading) * 1e9)


def check_endpoint(endpoint: str | None) -> str | None:
    """ValueError unless `endpoint` is None or an http(s) URL and the SDK is installed."""
    if not endpoint:
        return None
    if not endpoint.startswith(("http://", "https://")):
        raise ValueError(f"otlp traces endpoint {endpoint!r}: an http(s):// URL of an OTLP/HTTP receiver")
    import importlib.util

    if importlib.util.find_spec("opentelemetry.sdk") is None or \
            importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is None:
        raise ValueError("an otlp traces endpoint needs OpenTelemetry's SDK and OTLP/HTTP exporter: "
                         "pip install 'mindmotor[tracing]'")
    return endpoint


class Tracing:
    def __init__(self, service: str, endpoint: str | None = None):
        self.enabled = bool(endpoint)
        self._provider = self._tracer = None
        if not endpoint:
            return
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            raise ValueError("--otlp-traces-endpoint needs OpenTelemetry's SDK and OTLP exporter: "
                             "pip install 'mindmotor[tracing]'") from None
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"--otlp-traces-endpoint {endpoint!r}: an http(s):// URL of an OTLP/HTTP receiver")
        if endpoint.rstrip("/").count("/") == 2:          # host only: OTLP/HTTP's traces path
            endpoint = endpoint.rstrip("/") + "/v1/traces"
        self._provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_S)))
        self._tracer = self._provider.get_tracer("mindmotor")

    @staticmethod
    def extract(carrier) -> object | None:
        """The remote parent context from headers or gRPC metadata (pairs or a mapping)."""
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        items = carrier.items() if hasattr(carrier, "items") else carrier
        found = {k.lower(): v for k, v in items if k.lower() in (TRACEPARENT, TRACESTATE)}
        return TraceContextTextMapPropagator().extract(found) if found else None

    @staticmethod
    def inject(span) -> list[tuple[str, str]]:
        """gRPC metadata carrying `span` as the parent."""
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
        return list(carrier.items())

    def start(self, name: str, parent=None, start_s: float | None = None, attributes: dict | None = None,
              clock=time.monotonic):
        """A started span (end it with `.end()`), or None when tracing is off. `parent`: a span or
        an extracted context; `start_s`: its start, a reading of `clock`."""
        if not self.enabled:
            return None
        from opentelemetry import trace

        context = trace.set_span_in_context(parent) if isinstance(parent, trace.Span) else parent
        return self._tracer.start_span(name, context=context, attributes=attributes,
                                       start_time=wall_ns(start_s, clock) if start_s is not None else None)

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

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()           # exports what is still batched
