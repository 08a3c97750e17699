"""vLLM's HTTP surface beside the OpenAI routes: unknown model 404 model_not_found (the SDK raises
NotFoundError), wrong method 405 with Allow, /ping, /version, /openapi.json, and
stream_options.continuous_usage_stats (usage so far on every chunk)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from mindmotor import __version__


@pytest.fixture(scope="module")
def http(coordinator):
    with httpx.Client(base_url=coordinator.url, timeout=60) as c:
        yield c


def test_unknown_model_is_not_found_for_the_sdk(coordinator):
    with openai.OpenAI(base_url=coordinator.base_url, api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.NotFoundError) as info:
            client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["code"] == "model_not_found"


def test_wrong_method_is_405_with_allow(http):
    response = http.get("/v1/completions")
    assert response.status_code == 405 and response.headers["allow"] == "POST"
    assert response.json()["error"]["message"]


def test_ping_version_openapi(http):
    assert http.get("/ping").status_code == 200 and http.post("/ping").status_code == 200
    assert http.get("/version").json() == {"version": __version__}
    spec = http.get("/openapi.json").json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models"} <= set(spec["paths"])


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "count:"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "count"}]}),
])
def test_continuous_usage_stats(http, model_name, path, body):
    request = {"model": model_name, **body, "max_tokens": 6, "ignore_eos": True, "stream": True, "n": 2,
               "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = []
    with http.stream("POST", path, json=request) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    per_choice = [c for c in chunks if c["choices"]]
    assert per_choice and all(c["usage"] is not None for c in per_choice)
    last = {}
    for c in per_choice:
        index, usage = c["choices"][0]["index"], c["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert usage["completion_tokens"] >= last.get(index, 0)
        last[index] = usage["completion_tokens"]
    assert last == {0: 6, 1: 6}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12


def test_vllm_metric_names_on_the_coordinator(http, model_name):
    http.post("/v1/completions", json={"model": model_name, "prompt": "x", "max_tokens": 3, "ignore_eos": True})
    text = http.get("/metrics").text
    for series in ("vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
                   "vllm:time_per_output_token_seconds_bucket", "vllm:generation_tokens_total",
                   "vllm:num_requests_running"):
        assert f'{series}{{' in text and f'model_name="{model_name}"' in text, series
    assert f'vllm:time_to_first_token_seconds_bucket{{le="0.001",model_name="{model_name}"}}' in text


def test_cors(make_coordinator, virtual_workers):
    coord = make_coordinator(workers=[w.address for w in virtual_workers], cors_allowed_origins=["https://app.example"],
                             api_keys=["sk-test"])
    with httpx.Client(base_url=coord.url, timeout=30) as c:
        preflight = c.options("/v1/chat/completions", headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert preflight.status_code == 200            # answered before the API key check
        assert preflight.headers["access-control-allow-origin"] == "https://app.example"
        got = c.get("/v1/models", headers={"Origin": "https://app.example", "Authorization": "Bearer sk-test"})
        assert got.status_code == 200 and got.headers["access-control-allow-origin"] == "https://app.example"
        other = c.get("/v1/models", headers={"Origin": "https://evil.example", "Authorization": "Bearer sk-test"})
        assert "access-control-allow-origin" not in other.headers


def test_cors_is_off_by_default(http):
    response = http.get("/v1/models", headers={"Origin": "https://app.example"})
    assert "access-control-allow-origin" not in response.headers


def test_booleans_and_numbers_are_coerced_as_vllm_does(http, model_name):
    body = {"model": model_name, "prompt": "x", "max_tokens": "3", "temperature": "0", "ignore_eos": "true",
            "echo": 0, "logprobs": "1"}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert len(choice["logprobs"]["tokens"]) == 3 and response.json()["usage"]["completion_tokens"] == 3
