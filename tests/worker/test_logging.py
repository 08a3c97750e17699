"""JSON log lines: one object per line, the request id on request-scoped lines."""

from __future__ import annotations

import io
import json
import logging

from mindmotor.common.logging import request_context, setup_logging

from .rpc import collect, request
from .worker_process import start_worker


def test_json_lines_with_request_id_and_extra_fields():
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        setup_logging("svc", "DEBUG", stream=stream)
        log = logging.getLogger("mindmotor.test")
        log.info("outside")
        with request_context("req-7"):
            log.info("inside", extra={"tokens": 3})
        log.warning("explicit", extra={"request_id": "req-8"})
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])

    outside, inside, explicit = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert outside["msg"] == "outside" and outside["service"] == "svc" and "request_id" not in outside
    assert inside["request_id"] == "req-7" and inside["tokens"] == 3 and inside["level"] == "INFO"
    assert explicit["request_id"] == "req-8" and explicit["level"] == "WARNING"


def test_worker_logs_are_json_with_the_request_id(worker, tiny_model, tmp_path):
    """Per-request lines are DEBUG (issue 26: a line per request cost the worker CPU at every rate):
    absent at the default INFO, there with the request id at DEBUG."""
    collect(worker.stub.Generate(request("log me", request_id="quiet-request", max_tokens=3), timeout=30))
    assert '"quiet-request"' not in worker.log_text()

    debug = start_worker(tiny_model, tmp_path / "debug-worker.log", "--timing", "virtual", "--log-level", "DEBUG")
    try:
        collect(debug.stub.Generate(request("log me", request_id="logged-request", max_tokens=3), timeout=30))
        entries = [json.loads(line) for line in debug.log_text().splitlines() if line.startswith("{")]
    finally:
        debug.stop()

    assert {"worker ready", "engine ready"} <= {e["msg"] for e in entries}
    finished = [e for e in entries if e["msg"] == "request finished" and e.get("request_id") == "logged-request"]
    assert len(finished) == 1 and finished[0]["level"] == "DEBUG"
    assert finished[0]["completion_tokens"] == 3 and finished[0]["finish_reason"] == "length"
