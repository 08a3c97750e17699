"""Canary analysis judges a version on the errors it caused: through the real coordinator and
real workers, a 429 `instances_busy` and a client's bad parameter (400) are not counted in
`mindmotor_coordinator_version_errors_total`; a request the engine fails (a 500) is. (A 400 the
instance gives a request the coordinator accepted is the version's: tests/deployer/
test_safe_rollouts.py rolls such a canary back.)"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx

from .processes import InProcessCoordinator, start_workers, wait_until

FAULTY_WORKER = [sys.executable, str(Path(__file__).parent.parent / "worker" / "faulty_worker.py")]


def counts(c: InProcessCoordinator, model: str) -> tuple[float, float]:
    registry = c.coordinator.metrics.registry
    labels = {"model": model, "version": ""}
    requests = registry.get_sample_value("mindmotor_coordinator_version_requests_total", labels) or 0.0
    errors = registry.get_sample_value("mindmotor_coordinator_version_errors_total", labels) or 0.0
    return requests, errors


def post(c: InProcessCoordinator, body: dict, **headers) -> httpx.Response:
    return httpx.post(f"{c.base_url}/completions", json=body, headers=headers, timeout=60)


def test_busy_and_client_errors_are_not_the_versions_fault_but_engine_failures_are(tiny_ckpt, tmp_path, model_name):
    (busy,) = start_workers(tiny_ckpt, tmp_path / "busy", 1, "--timing", "realtime", "--emulate", "llama2-7b",
                            "--max-concurrent-requests", "2")
    c = InProcessCoordinator(workers=[busy.address], model_dir=str(tiny_ckpt))
    try:
        wait_until(lambda: c.coordinator.table.candidates(model_name), what="the worker routable")
        response = post(c, {"model": model_name, "prompt": "x", "n": 4, "max_tokens": 200, "ignore_eos": True})
        assert response.status_code == 429 and response.json()["error"]["code"] == "instances_busy"
        wait_until(lambda: counts(c, model_name)[0] == 1, what="the busy request counted for its version")
        assert counts(c, model_name) == (1, 0)
        wait_until(busy.idle, what="the admitted choices were cancelled")
        ok = post(c, {"model": model_name, "prompt": "x", "max_tokens": 2})
        assert ok.status_code == 200, ok.text
        wait_until(lambda: counts(c, model_name)[0] == 2, what="the good request counted")
        assert counts(c, model_name) == (2, 0)
        bad = post(c, {"model": model_name, "prompt": "x", "max_tokens": 2, "seed": -1})
        assert bad.status_code == 400, bad.text
        ok = post(c, {"model": model_name, "prompt": "x", "max_tokens": 2})
        wait_until(lambda: counts(c, model_name)[0] == 3, what="the next good request counted")
        assert counts(c, model_name) == (3, 0)                 # the 400 is nobody's version error
    finally:
        c.stop()
        busy.stop()

    faulty = start_workers(tiny_ckpt, tmp_path / "faulty", 1, "--timing", "virtual", program=FAULTY_WORKER)
    c = InProcessCoordinator(workers=[w.address for w in faulty], model_dir=str(tiny_ckpt))
    try:
        wait_until(lambda: c.coordinator.table.candidates(model_name), what="the worker routable")
        response = post(c, {"model": model_name, "prompt": "x", "max_tokens": 8, "ignore_eos": True},
                        **{"X-Request-Id": "poison-1"})
        assert response.status_code >= 500, response.text
        wait_until(lambda: counts(c, model_name)[0] == 1, what="the failed request counted")
        assert counts(c, model_name) == (1, 1)
    finally:
        c.stop()
        for w in faulty:
            w.stop()
