"""API keys (401), per-key rate limits in memory and shared through Redis (429 + Retry-After),
and the per-model queue limit (429 + Retry-After)."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest
import redis

from .processes import wait_until

KEYS = ["sk-alpha", "sk-beta"]


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_api_keys_401_for_missing_or_wrong_200_for_right(make_coordinator, virtual_workers, model_name):
    c = make_coordinator(workers=[virtual_workers[0].address], api_keys=KEYS)
    body = {"model": model_name, "prompt": "hi", "max_tokens": 2}
    with httpx.Client(base_url=c.url, timeout=30) as http:
        error = error_of(http.post("/v1/completions", json=body), 401)
        assert error["type"] == "authentication_error" and error["code"] == "missing_api_key"
        error = error_of(http.post("/v1/completions", json=body, headers={"Authorization": "Bearer sk-gamma"}), 401)
        assert error["code"] == "invalid_api_key"
        assert http.post("/v1/completions", json=body, headers={"Authorization": "Basic sk-alpha"}).status_code == 401
        # 401 comes before the body is even parsed
        assert http.post("/v1/completions", content=b"{broken").status_code == 401
        for key in KEYS:
            assert http.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}).status_code == 200
        assert http.get("/v1/models").status_code == 401
        assert http.get("/health").status_code == 200           # probes and metrics need no key
        assert http.get("/metrics").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=c.base_url, api_key="sk-wrong", max_retries=0).models.list()
    assert openai.OpenAI(base_url=c.base_url, api_key="sk-beta", max_retries=0).models.list().data


def test_keys_are_kept_hashed(make_coordinator, virtual_workers):
    c = make_coordinator(workers=[virtual_workers[0].address], api_keys=KEYS)
    keys = c.coordinator.keys
    assert all(len(d) == 32 and d not in (b"sk-alpha", b"sk-beta") for d in keys._digests)


def test_rate_limit_per_key_429_with_retry_after(make_coordinator, virtual_workers):
    c = make_coordinator(workers=[virtual_workers[0].address], api_keys=KEYS, rate_limit_rpm=6, rate_limit_burst=2)
    alpha = {"Authorization": "Bearer sk-alpha"}
    with httpx.Client(base_url=c.url, timeout=30) as http:
        assert [http.get("/v1/models", headers=alpha).status_code for _ in range(2)] == [200, 200]
        limited = http.get("/v1/models", headers=alpha)
        error = error_of(limited, 429)
        assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
        assert 1 <= int(limited.headers["retry-after"]) <= 10            # one token per 10 s
        # another key has its own bucket
        assert http.get("/v1/models", headers={"Authorization": "Bearer sk-beta"}).status_code == 200


def test_rate_limit_shared_through_redis(make_coordinator, virtual_workers):
    prefix = f"mindmotor-test:{uuid.uuid4().hex}:"
    settings = dict(workers=[virtual_workers[0].address], api_keys=KEYS, rate_limit_rpm=6, rate_limit_burst=3,
                    redis_url="redis://127.0.0.1:6379/0", redis_prefix=prefix)
    a, b = make_coordinator(**settings), make_coordinator(**settings)
    alpha = {"Authorization": "Bearer sk-alpha"}
    try:
        with httpx.Client(timeout=30) as http:
            codes = [http.get(f"{url}/v1/models", headers=alpha).status_code for url in (a.url, b.url, a.url)]
            assert codes == [200, 200, 200]
            limited = http.get(f"{b.url}/v1/models", headers=alpha)       # the 4th, on either coordinator
            error_of(limited, 429)
            assert int(limited.headers["retry-after"]) >= 1
        keys = redis.Redis().keys(prefix + "*")
        assert len(keys) == 1                                              # one bucket: the key's
    finally:
        r = redis.Redis()
        for key in r.keys(prefix + "*"):
            r.delete(key)


def test_queue_full_429_with_retry_after(make_coordinator, realtime_worker, model_name):
    c = make_coordinator(workers=[realtime_worker.address], max_requests=2)
    long = {"model": model_name, "prompt": "a long one", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=c.url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=long) as first:
            assert first.status_code == 200
            lines = first.iter_lines()        # keep the iterator: dropping it closes the connection
            next(lines)
            # n=2 would make three outstanding choices: refused, while n=1 still fits
            full = http.post("/v1/completions", json={"model": model_name, "prompt": "hi", "n": 2})
            error = error_of(full, 429)
            assert error["code"] == "queue_full" and full.headers["retry-after"] == "1"
            assert http.post("/v1/completions", json={"model": model_name, "prompt": "hi",
                                                      "max_tokens": 2}).status_code == 200
        # the first stream closed: its place is given back
        wait_until(lambda: c.coordinator.admission.outstanding.get(model_name) == 0, timeout=5)
        with pytest.raises(openai.BadRequestError, match="could never be admitted"):   # 3 > the limit: never
            openai.OpenAI(base_url=c.base_url, api_key="x", max_retries=0).completions.create(
                model=model_name, prompt="hi", n=3)
    wait_until(realtime_worker.idle, timeout=5)
