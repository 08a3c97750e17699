"""An OTLP/HTTP traces receiver for tests and benchmarks: a real HTTP server (a thread of the
caller's process, a free port) that decodes every export (`ExportTraceServiceRequest`, protobuf)
and keeps its spans. Point `--otlp-traces-endpoint` at `url`.

Used by tests/coordinator/test_tracing.py, tests/e2e (P/D traces) and benchmarks/tracing_overhead.py."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class ReceivedSpan:
    service: str          # the resource's service.name
    name: str
    trace_id: str         # hex
    span_id: str          # hex
    parent_id: str        # hex; "" for a root span
    attributes: dict
    events: tuple[str, ...]


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else None


class OtlpReceiver:
    """`spans`: every span received, in order (keep=False: only `count`, for benchmarks)."""

    def __init__(self, keep: bool = True):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.spans: list[ReceivedSpan] = []
        self.count = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                request = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers["Content-Length"])))
                receiver._received(request, keep)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _received(self, request, keep: bool) -> None:
        got, n = [], 0
        for rs in request.resource_spans:
            service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
            for ss in rs.scope_spans:
                n += len(ss.spans)
                if keep:
                    got.extend(ReceivedSpan(service, s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                                            {a.key: _value(a.value) for a in s.attributes},
                                            tuple(e.name for e in s.events)) for s in ss.spans)
        with self._lock:
            self.count += n
            self.spans.extend(got)

    def named(self, name: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.name == name]

    def names(self) -> set[str]:
        with self._lock:
            return {s.name for s in self.spans}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
