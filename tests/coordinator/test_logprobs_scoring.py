"""Logprobs in the OpenAI/vLLM shapes and prompt scoring over HTTP, with the unmodified `openai`
SDK where it has the fields: completions top_logprobs include the sampled token (up to k + 1),
logprobs 0 gives the token alone, echo + logprobs + max_tokens 0 scores the prompt with logprobs
equal to the dense reference model's (also on a prefix-cache hit, and streamed), vLLM's
prompt_logprobs and return_tokens_as_token_ids."""

from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pytest

from mindmotor.engine.sampler import log_softmax
from mindmotor.model.llama import LlamaModel


@pytest.fixture(scope="module")
def client(coordinator):
    with openai.OpenAI(base_url=coordinator.base_url, api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def http(coordinator):
    with httpx.Client(base_url=coordinator.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def dense(tiny_ckpt):
    return LlamaModel.from_pretrained(tiny_ckpt)


@pytest.fixture(scope="module")
def tok(coordinator, model_name):
    return coordinator.coordinator.catalog.tokenizer(model_name)


def reference(dense, ids: list[int]) -> np.ndarray:
    lp = log_softmax(dense.forward_dense(ids).astype(np.float64))
    return np.array([lp[i, ids[i + 1]] for i in range(len(ids) - 1)])


PROMPT = "The quick brown fox jumps over the lazy dog, again and again"


def test_echo_logprobs_max_tokens_0_scores_the_prompt(client, model_name, dense, tok):
    ids = tok.encode(PROMPT)
    for attempt in range(2):                          # the second hits the prefix cache: recomputed
        out = client.completions.create(model=model_name, prompt=PROMPT, echo=True, logprobs=2, max_tokens=0)
        (choice,) = out.choices
        assert choice.text == PROMPT and choice.finish_reason == "length"
        lp = choice.logprobs
        assert lp.tokens == [tok.decode([t], skip_special_tokens=False) for t in ids]
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        np.testing.assert_allclose(lp.token_logprobs[1:], reference(dense, ids), atol=1e-3)
        for token, value, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
            assert top[token] == value and 2 <= len(top) <= 3
        assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
        assert out.usage.completion_tokens == 0 and out.usage.prompt_tokens == len(ids)


def test_echo_logprobs_with_generation(client, model_name, dense, tok):
    ids = tok.encode(PROMPT)
    out = client.completions.create(model=model_name, prompt=PROMPT, echo=True, logprobs=1, max_tokens=3,
                                    temperature=0)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 3 and out.usage.completion_tokens == 3
    np.testing.assert_allclose(lp.token_logprobs[1:len(ids)], reference(dense, ids), atol=1e-3)
    assert out.choices[0].text.startswith(PROMPT) and lp.text_offset[len(ids)] == len(PROMPT)


def test_streamed_scoring_equals_the_response(http, model_name):
    body = {"model": model_name, "prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 2,
            "temperature": 0}
    whole = http.post("/v1/completions", json=body).json()["choices"][0]
    text, tokens, values = "", [], []
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    text += choice["text"]
                    if choice["logprobs"]:
                        tokens += choice["logprobs"]["tokens"]
                        values += choice["logprobs"]["token_logprobs"]
    assert text == whole["text"] and tokens == whole["logprobs"]["tokens"]
    assert values == whole["logprobs"]["token_logprobs"]


@pytest.mark.parametrize("k", [0, 1, 5])
def test_completion_top_logprobs_include_the_sampled_token(client, model_name, k):
    # token ids as keys: distinct tokens with the same text would share a key
    out = client.completions.create(model=model_name, prompt=PROMPT, logprobs=k, max_tokens=12, temperature=1.0,
                                    seed=4, extra_body={"return_tokens_as_token_ids": True})
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == 12
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert top[token] == value
        assert (len(top) == 1) if k == 0 else (k <= len(top) <= k + 1)
        assert all(v <= 0 for v in top.values())


def test_vllm_prompt_logprobs(http, model_name, dense, tok):
    ids = tok.encode(PROMPT)
    body = {"model": model_name, "prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 2}
    got = http.post("/v1/completions", json=body).json()["choices"][0]["prompt_logprobs"]
    assert got[0] is None and len(got) == len(ids)
    ref = reference(dense, ids)
    for i, entry in enumerate(got[1:]):
        mine = entry[str(ids[i + 1])]
        assert abs(mine["logprob"] - ref[i]) < 1e-3 and mine["rank"] >= 1
        assert mine["decoded_token"] == tok.decode([ids[i + 1]], skip_special_tokens=False)
        assert 2 <= len(entry) <= 3
        ranks = sorted(v["rank"] for k, v in entry.items() if k != str(ids[i + 1]))
        assert ranks == [1, 2][:len(ranks)]
    chat = http.post("/v1/chat/completions", json={
        "model": model_name, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1,
        "prompt_logprobs": 0}).json()
    assert chat["prompt_logprobs"][0] is None and all(len(e) == 1 for e in chat["prompt_logprobs"][1:])


def test_return_tokens_as_token_ids(http, model_name):
    body = {"model": model_name, "prompt": PROMPT, "max_tokens": 3, "logprobs": 1, "temperature": 0,
            "return_tokens_as_token_ids": True}
    lp = http.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    assert all(t.startswith("token_id:") and int(t.split(":")[1]) >= 0 for t in lp["tokens"])
    chat = http.post("/v1/chat/completions", json={
        "model": model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logprobs": True,
        "top_logprobs": 2, "return_tokens_as_token_ids": True}).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert all(e["token"].startswith("token_id:") for e in content)
    assert all(t["token"].startswith("token_id:") for e in content for t in e["top_logprobs"])
