"""Traces over OTLP/HTTP (--otlp-traces-endpoint): a real receiver (an HTTP server decoding the
OTLP protobuf) gets the coordinator's and the worker's spans of one request under one trace id —
the client's traceparent, through the coordinator's worker call (gRPC metadata) to the worker's
call and its queue, prefill and decode spans; and the endpoint is checked at start."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from mindmotor.common.waiting import wait_until
from mindmotor.coordinator.config import CoordinatorSettings

from .processes import InProcessCoordinator, WorkerProcess

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


class Receiver:
    """An OTLP/HTTP traces receiver: every span as (service, name, trace id, span id, parent id)."""

    def __init__(self):
        self.spans: list[tuple[str, str, str, str, str]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                for rs in request.resource_spans:
                    service = next(a.value.string_value for a in rs.resource.attributes if a.key == "service.name")
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            receiver.spans.append((service, s.name, s.trace_id.hex(), s.span_id.hex(),
                                                   s.parent_span_id.hex()))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def test_one_request_is_one_trace_from_client_to_worker(receiver, tiny_ckpt, model_name, tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")        # export batches every 50 ms (default 5 s)
    worker = WorkerProcess(tiny_ckpt, tmp_path / "worker.log", "--timing", "virtual",
                           "--otlp-traces-endpoint", receiver.url).wait_ready()
    coordinator = InProcessCoordinator(workers=[worker.address], model_dir=str(tiny_ckpt),
                                       otlp_traces_endpoint=receiver.url)
    try:
        response = httpx.post(coordinator.url + "/v1/completions", timeout=60,
                              json={"model": model_name, "prompt": "x", "max_tokens": 3, "ignore_eos": True},
                              headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})
        assert response.status_code == 200, response.text
        names = {"mindmotor.choice", "mindmotor.worker_call", "mindmotor.worker.generate", "mindmotor.worker.queue",
                 "mindmotor.worker.prefill", "mindmotor.worker.decode"}
        wait_until(lambda: names <= {s[1] for s in receiver.spans}, timeout=20, what="every span exported")
    finally:
        coordinator.stop()
        worker.stop()
    by_name = {s[1]: s for s in receiver.spans}
    assert {s[2] for s in receiver.spans} == {TRACE_ID}                      # one trace, the client's
    assert by_name["mindmotor.choice"][0] == "mindmotor-coordinator"
    assert by_name["mindmotor.choice"][4] == CLIENT_SPAN
    assert by_name["mindmotor.worker_call"][4] == by_name["mindmotor.choice"][3]
    assert by_name["mindmotor.worker.generate"][0] == "mindmotor-worker"
    assert by_name["mindmotor.worker.generate"][4] == by_name["mindmotor.worker_call"][3]   # over gRPC
    for phase in ("queue", "prefill", "decode"):
        assert by_name[f"mindmotor.worker.{phase}"][4] == by_name["mindmotor.worker.generate"][3]


def test_the_endpoint_is_checked(tiny_ckpt):
    with pytest.raises(ValueError, match="http"):
        CoordinatorSettings(model_dir=str(tiny_ckpt), otlp_traces_endpoint="collector:4318")
