"""The smaller endpoints and cross-cutting behaviour: tokenize/detokenize, health and readiness,
metrics, request ids, echo."""

from __future__ import annotations

import httpx
import pytest


@pytest.fixture(scope="module")
def http(coordinator):
    with httpx.Client(base_url=coordinator.url, timeout=30) as client:
        yield client


def test_tokenize_and_detokenize_round_trip(http, model_name, coordinator):
    tok = coordinator.coordinator.catalog.tokenizer(model_name)
    out = http.post("/tokenize", json={"model": model_name, "prompt": "Hello, world!"}).json()
    assert out["tokens"] == tok.encode("Hello, world!") and out["count"] == len(out["tokens"])
    assert out["max_model_len"] == 1024
    back = http.post("/detokenize", json={"model": model_name, "tokens": out["tokens"]}).json()
    assert back == {"prompt": "Hello, world!"}


def test_tokenize_messages_uses_the_chat_template(http, model_name, coordinator):
    messages = [{"role": "user", "content": "hi"}]
    out = http.post("/tokenize", json={"model": model_name, "messages": messages}).json()
    tok = coordinator.coordinator.catalog.tokenizer(model_name)
    assert out["tokens"] == tok.encode(tok.apply_chat_template(messages))


def test_tokenize_errors(http, model_name):
    assert http.post("/tokenize", json={"model": model_name}).status_code == 400
    assert http.post("/detokenize", json={"model": model_name, "tokens": [-1]}).status_code == 400
    assert http.post("/detokenize", json={"model": "nope", "tokens": [1]}).status_code == 404   # model_not_found


def test_health_ready_and_models(http, model_name):
    health = http.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    ready = http.get("/ready")
    assert ready.status_code == 200 and ready.json()["models"] == [model_name]
    card = http.get(f"/v1/models/{model_name}").json()
    assert card["id"] == model_name and card["root"] and card["created"] > 0


def test_request_id_header_generated_or_kept(http):
    generated = http.get("/health").headers["x-request-id"]
    assert len(generated) == 32
    assert http.get("/health", headers={"X-Request-Id": "my-id-1"}).headers["x-request-id"] == "my-id-1"
    assert http.get("/health", headers={"X-Request-Id": "bad id\t!"}).headers["x-request-id"] != "bad id\t!"


def test_request_id_is_the_response_id(http, model_name):
    r = http.post("/v1/completions", json={"model": model_name, "prompt": "hi", "max_tokens": 2},
                  headers={"X-Request-Id": "abc123"})
    assert r.headers["x-request-id"] == "abc123" and r.json()["id"] == "cmpl-abc123"


def test_echo_prepends_the_prompt(http, model_name):
    body = {"model": model_name, "prompt": "Echo me", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    plain = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    echoed = http.post("/v1/completions", json={**body, "echo": True}).json()["choices"][0]["text"]
    assert echoed == "Echo me" + plain


def test_metrics_count_requests_and_latencies(http, model_name):
    http.post("/v1/completions", json={"model": model_name, "prompt": "count me", "max_tokens": 3,
                                       "ignore_eos": True})
    http.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    for i in range(3):                  # client-chosen paths do not mint series: routes label the counter
        http.get(f"/v1/models/made-up-{i}")
        http.get(f"/v1/no-such-endpoint-{i}")
    text = http.get("/metrics").text
    assert "made-up" not in text and "no-such-endpoint" not in text
    assert 'endpoint="/v1/models/{name:path}"' in text and 'endpoint="unmatched"' in text
    assert f'mindmotor_coordinator_requests_total{{endpoint="/v1/completions",model="{model_name}",status="200"}}' in text
    assert 'status="404"' in text
    for name in ("time_to_first_token_seconds_bucket", "inter_token_latency_seconds_bucket",
                 "time_per_output_token_seconds_bucket", "e2e_request_latency_seconds_bucket",
                 "outstanding_requests", "retries_total", "migrations_total", "routable_instances"):
        assert f"mindmotor_coordinator_{name}" in text, name
    assert f'mindmotor_coordinator_routable_instances{{model="{model_name}"}} 2.0' in text
