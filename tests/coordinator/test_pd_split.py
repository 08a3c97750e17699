"""The Coordinator over a prefill worker and a decode worker (real processes): greedy output
through the split equals mixed workers token for token; a dead prefill worker means the prompt is
computed on the decode worker, not an error; a client that goes away stops both sides and leaves no
pinned KV behind."""

from __future__ import annotations

import httpx
import openai
import pytest

from .processes import REALTIME_ARGS, start_workers, wait_until

PROMPTS = ["The prefill worker reads this prompt", "and the decode worker writes the rest of it"]
GREEDY = dict(temperature=0.0, max_tokens=20, extra_body={"ignore_eos": True})


def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def pd_workers(tiny_ckpt, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("pd-logs")
    (p,) = start_workers(tiny_ckpt, log_dir, 1, *REALTIME_ARGS, "--role", "prefill")
    (d,) = start_workers(tiny_ckpt, log_dir, 1, *REALTIME_ARGS, "--role", "decode", "--kv-pull-timeout", "2")
    yield p, d
    for w in (p, d):
        w.stop()


@pytest.fixture(scope="module")
def undisturbed(coordinator, model_name):
    c = client(coordinator.base_url)
    return [c.completions.create(model=model_name, prompt=p, **GREEDY).choices[0].text for p in PROMPTS]


def test_split_equals_mixed(pd_workers, make_coordinator, model_name, undisturbed):
    p, d = pd_workers
    coord = make_coordinator(workers=[p.address, d.address])
    c = client(coord.base_url)
    texts = [c.completions.create(model=model_name, prompt=prompt, **GREEDY).choices[0].text for prompt in PROMPTS]
    assert texts == undisturbed
    streamed = "".join(chunk.choices[0].text for chunk in c.completions.create(
        model=model_name, prompt=PROMPTS[0], stream=True, **GREEDY) if chunk.choices)
    assert streamed == undisturbed[0]
    assert d.status().load.kv_transfers >= 3 and p.status().load.kv_pinned == 0
    metrics = httpx.get(coord.url + "/metrics").text
    assert "mindmotor_coordinator_pd_prefills_total" in metrics


def test_client_cancel_stops_both_sides(pd_workers, make_coordinator, model_name):
    p, d = pd_workers
    coord = make_coordinator(workers=[p.address, d.address])
    stream = client(coord.base_url).completions.create(
        model=model_name, prompt=PROMPTS[1], stream=True, temperature=0.0, max_tokens=300,
        extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 5:
            break
    stream.close()
    wait_until(lambda: d.idle() and p.idle() and p.status().load.kv_pinned == 0, timeout=10)


def test_dead_prefill_worker_falls_back_to_decode(pd_workers, tiny_ckpt, tmp_path, make_coordinator,
                                                  model_name, undisturbed):
    _, d = pd_workers
    (p,) = start_workers(tiny_ckpt, tmp_path, 1, "--timing", "virtual", "--role", "prefill")
    try:
        coord = make_coordinator(workers=[p.address, d.address], status_interval_s=30)
        p.kill()                                 # the coordinator still lists it as a prefill instance
        c = client(coord.base_url)
        assert c.completions.create(model=model_name, prompt=PROMPTS[0], **GREEDY).choices[0].text == undisturbed[0]
        metrics = httpx.get(coord.url + "/metrics").text
        assert 'mindmotor_coordinator_pd_fallbacks_total{model="%s",reason="prefill_failed"} 1.0' % model_name \
            in metrics
    finally:
        p.stop()


def test_split_carries_structured_output_and_prompt_logprobs(pd_workers, make_coordinator, model_name, coordinator):
    """Through the split: the grammar masks the first token on the prefill worker and follows it on
    the decode worker (the output equals a mixed worker's, seeded); prompt logprobs come from the
    prefill worker once."""
    p, d = pd_workers
    coord = make_coordinator(workers=[p.address, d.address])
    body = {"model": model_name, "prompt": PROMPTS[0], "max_tokens": 60, "temperature": 1.0, "seed": 9,
            "guided_regex": "[a-e]{3,12}-[0-9]{2}", "prompt_logprobs": 1}
    split = httpx.post(coord.url + "/v1/completions", json=body, timeout=30).json()["choices"][0]
    mixed = httpx.post(coordinator.url + "/v1/completions", json=body, timeout=30).json()["choices"][0]
    assert split["text"] == mixed["text"] and split["finish_reason"] == "stop"
    assert split["prompt_logprobs"] == mixed["prompt_logprobs"] and split["prompt_logprobs"][0] is None
    assert d.status().load.kv_transfers >= 1
