"""Every error status, in the OpenAI error shape: 400 (bad parameters, unknown model, context
too long, malformed JSON, worker refusals), 413, 503; 401 and 429 are in test_auth_and_limits."""

from __future__ import annotations

import httpx
import openai
import pytest

from mindmotor.common.ports import free_port


@pytest.fixture(scope="module")
def http(coordinator):
    with httpx.Client(base_url=coordinator.url, timeout=30) as client:
        yield client


def assert_openai_error(response: httpx.Response, status: int, param: str | None = "ANY") -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param != "ANY":
        assert error["param"] == param
    return error


@pytest.mark.parametrize("body, param, words", [
    ({"prompt": "hi", "temperature": 3}, "temperature", "less than or equal to 2"),
    ({"prompt": "hi", "top_p": 0}, "top_p", "greater than 0"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens", "only allowed with echo"),
    ({"prompt": "hi", "max_tokens": -1}, "max_tokens", "greater than or equal to 0"),
    ({"prompt": "hi", "max_tokens": "many"}, "max_tokens", "valid integer"),
    ({"prompt": "hi", "n": 0}, "n", "greater than or equal to 1"),
    ({"prompt": "hi", "n": 1000}, "n", "at most"),
    ({"prompt": "hi", "logprobs": 21}, "logprobs", "less than or equal to 20"),
    ({"prompt": "hi", "presence_penalty": -3}, "presence_penalty", "greater than or equal to -2"),
    ({"prompt": "hi", "stop": ["x"] * 17}, "stop", "at most 16"),
    ({"prompt": "hi", "stop": [""]}, "stop", "must not be empty"),
    ({"prompt": "hi", "stream": "maybe"}, "stream", "valid boolean"),
    ({"prompt": "hi", "echo": 2}, "echo", "valid boolean"),
    ({"prompt": "hi", "min_tokens": 9, "max_tokens": 4}, "min_tokens", "must not exceed"),
    ({"prompt": ""}, "prompt", "empty"),
    ({"prompt": []}, "prompt", "empty"),
    ({"prompt": {"text": "hi"}}, "prompt", "valid"),
    ({}, "prompt", "Field required"),
    ({"prompt": "hi", "echo": True, "max_tokens": 0, "min_tokens": 1}, "min_tokens", "must be 0"),
    ({"prompt": "hi", "prompt_logprobs": 21}, "prompt_logprobs", "less than or equal to 20"),
])
def test_invalid_completion_parameters_are_400(http, model_name, body, param, words):
    error = assert_openai_error(http.post("/v1/completions", json={"model": model_name, **body}), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert words in error["message"]


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages.0.content"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"x": 1}}, "logit_bias"),
    ({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": 101}}, "logit_bias"),
])
def test_invalid_chat_parameters_are_400(http, model_name, body, param):
    error = assert_openai_error(http.post("/v1/chat/completions", json={"model": model_name, **body}), 400)
    assert error["param"] == param


def test_unknown_model_is_404(http):
    error = assert_openai_error(http.post("/v1/completions", json={"model": "gpt-9", "prompt": "hi"}), 404, "model")
    assert error["code"] == "model_not_found" and "gpt-9" in error["message"]


def test_prompt_longer_than_the_context_is_400_before_any_worker(http, model_name):
    error = assert_openai_error(http.post("/v1/completions", json={"model": model_name, "prompt": [5] * 1024}),
                                400, "prompt")
    assert error["code"] == "context_length_exceeded" and "1024" in error["message"]
    error = assert_openai_error(http.post("/v1/completions", json={
        "model": model_name, "prompt": [5] * 1000, "max_tokens": 100}), 400, "max_tokens")
    assert "1100 were requested" in error["message"]


def test_the_workers_invalid_argument_becomes_400(http, model_name):
    error = assert_openai_error(http.post("/v1/completions", json={"model": model_name, "prompt": [5, 100000]}),
                                400)
    assert "outside the vocabulary" in error["message"]
    error = assert_openai_error(http.post("/v1/completions", json={
        "model": model_name, "prompt": "hi", "stop_token_ids": [100000]}), 400)
    assert "stop_token_ids" in error["message"]


def test_invalid_argument_in_a_stream_request_is_still_a_400(http, model_name):
    response = http.post("/v1/completions", json={"model": model_name, "prompt": [100000], "stream": True})
    assert_openai_error(response, 400)


@pytest.mark.parametrize("content", [b'{"model": "x", "prompt": ', b"not json at all", b"[1, 2]", b'"str"', b""])
def test_malformed_json_is_400_never_500(http, content):
    response = http.post("/v1/completions", content=content, headers={"content-type": "application/json"})
    assert_openai_error(response, 400)


def test_unknown_route_is_a_404_in_the_error_shape(http):
    assert_openai_error(http.get("/v1/nothing-here"), 404)


def test_openai_client_raises_bad_request(coordinator, model_name):
    client = openai.OpenAI(base_url=coordinator.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=model_name, prompt="hi", temperature=5)
    assert raised.value.status_code == 400
    assert raised.value.body["param"] == "temperature"


def test_body_over_the_limit_is_413_announced_or_chunked(make_coordinator, virtual_workers, model_name):
    c = make_coordinator(workers=[virtual_workers[0].address], max_body_bytes=2000)
    big = {"model": model_name, "prompt": "x" * 3000}
    with httpx.Client(base_url=c.url, timeout=30) as http:
        assert_openai_error(http.post("/v1/completions", json=big), 413)

        def chunked():
            for _ in range(10):
                yield b" " * 300
            yield b'{"model": "m", "prompt": "hi"}'

        response = http.post("/v1/completions", content=chunked(), headers={"content-type": "application/json"})
        assert "content-length" not in response.request.headers
        error = assert_openai_error(response, 413)
        assert error["code"] == "body_too_large"
        small = http.post("/v1/completions", json={"model": model_name, "prompt": "hi", "max_tokens": 2})
        assert small.status_code == 200


def test_no_healthy_instance_is_503(make_coordinator, model_name):
    c = make_coordinator(workers=[f"127.0.0.1:{free_port()}"])
    with httpx.Client(base_url=c.url, timeout=30) as http:
        error = assert_openai_error(http.post("/v1/completions", json={"model": model_name, "prompt": "hi"}), 503)
        assert error["code"] == "no_instance_available"
        assert http.get("/health").status_code == 503
        assert http.get("/ready").status_code == 503
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == [model_name]
