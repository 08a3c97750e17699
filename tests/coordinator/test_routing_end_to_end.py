"""Routing through real workers: traffic reaches both; cache_aware sends a shared prefix back to
the instance that holds it; per-instance routing counts in /metrics."""

from __future__ import annotations

import httpx


def generation_tokens(worker) -> int:
    return worker.status().load.generation_tokens


def test_both_workers_receive_traffic(coordinator, virtual_workers, model_name):
    before = [generation_tokens(w) for w in virtual_workers]
    with httpx.Client(base_url=coordinator.url, timeout=30) as http:
        for i in range(6):
            r = http.post("/v1/completions", json={"model": model_name, "prompt": f"request {i}", "max_tokens": 3,
                                                   "ignore_eos": True})
            assert r.status_code == 200
        metrics = http.get("/metrics").text
    after = [generation_tokens(w) for w in virtual_workers]
    gained = [a - b for a, b in zip(after, before)]
    assert all(g > 0 for g in gained) and sum(gained) == 18
    for w in virtual_workers:
        assert f'mindmotor_coordinator_routed_total{{instance_id="{w.address}",model="{model_name}"}}' in metrics


def test_cache_aware_keeps_a_shared_prefix_on_one_instance(make_coordinator, virtual_workers, model_name):
    c = make_coordinator(workers=[w.address for w in virtual_workers], policy="cache_aware")
    prefix = [(7 * i) % 300 + 10 for i in range(64)]            # four full blocks of 16
    with httpx.Client(base_url=c.url, timeout=30) as http:
        for i in range(5):
            r = http.post("/v1/completions", json={"model": model_name, "prompt": prefix + [i + 1, i + 2],
                                                   "max_tokens": 2, "ignore_eos": True})
            assert r.status_code == 200
    routed = c.coordinator.metrics.routed
    counts = [routed.labels(model_name, w.address)._value.get() for w in virtual_workers]
    assert sorted(counts) == [0, 5]
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 64
