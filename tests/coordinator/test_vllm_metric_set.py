"""vLLM's metric set on the coordinator's /metrics, consistent with itself: N requests move every
per-request counter and histogram count by exactly N (also a one-token request, whose
only piece is its last) (tokens by exactly the responses' usage),
the phase histograms add up to the e2e sums, and the engine gauges come back to idle."""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mindmotor.common import vllm_metrics as V
from mindmotor.common.waiting import wait_until
from mindmotor.common.latency_phases import PHASES

N_PLAIN, N_STREAMED = 4, 2
PER_REQUEST_HISTOGRAMS = (V.TTFT, V.E2E, V.QUEUE_TIME, V.PREFILL_TIME, V.DECODE_TIME, V.INFERENCE_TIME)


def samples(client: httpx.Client) -> dict[tuple, float]:
    """(sample name, sorted labels) -> value, of one scrape."""
    out = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(scrape: dict, name: str, **labels) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(v for (n, ls), v in scrape.items() if n == name and labels.items() <= dict(ls).items())


@pytest.fixture(scope="module")
def coordinator_http(virtual_workers, tiny_ckpt):
    from .processes import InProcessCoordinator

    c = InProcessCoordinator(workers=[w.address for w in virtual_workers], model_dir=str(tiny_ckpt))
    with httpx.Client(base_url=c.url, timeout=60) as client:
        yield client
    c.stop()


def test_n_requests_move_every_metric_by_n(coordinator_http, model_name):
    http, m = coordinator_http, {"model_name": model_name}
    before = samples(http)
    usages = []
    for i in range(N_PLAIN):
        body = {"model": model_name, "prompt": f"request {i} " + "x" * 30, "max_tokens": 1 if i == 0 else 5 + i,
                "ignore_eos": True}
        response = http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        usages.append(response.json()["usage"])
    for i in range(N_STREAMED):
        body = {"model": model_name, "messages": [{"role": "user", "content": f"stream {i}"}], "max_tokens": 4,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            chunks = [json.loads(line[6:]) for line in response.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        usages.append(chunks[-1]["usage"])
    n = N_PLAIN + N_STREAMED
    after = samples(http)

    def delta(name, **labels):
        return total(after, name, **m, **labels) - total(before, name, **m, **labels)

    prompt = sum(u["prompt_tokens"] for u in usages)
    generated = sum(u["completion_tokens"] for u in usages)
    assert delta(V.REQUEST_SUCCESS + "_total") == n
    assert delta(V.REQUEST_SUCCESS + "_total", finished_reason="length") == n
    assert delta(V.PROMPT_TOKENS + "_total") == prompt
    assert delta(V.GENERATION_TOKENS + "_total") == generated
    assert delta(V.PREFIX_CACHE_QUERIES + "_total") == prompt
    assert 0 <= delta(V.PREFIX_CACHE_HITS + "_total") <= prompt
    assert delta(V.NUM_PREEMPTIONS + "_total") == 0          # the workers' pools are far from full
    for name in PER_REQUEST_HISTOGRAMS:
        assert delta(name + "_count") == n, name
        assert delta(name + "_bucket", le="+Inf") == n, name
    assert delta(V.TPOT + "_count") == n - 1                 # a one-token request has no TPOT
    # one gap per token after the first (the workers send a chunk per token)
    assert delta(V.INTER_TOKEN + "_count") == generated - n

    e2e = delta(V.E2E + "_sum")
    queue, prefill, decode = (delta(x + "_sum") for x in (V.QUEUE_TIME, V.PREFILL_TIME, V.DECODE_TIME))
    assert e2e > 0 and prefill > 0 and decode > 0
    assert abs(queue + prefill + decode - e2e) <= 0.01 * e2e
    assert abs(delta(V.INFERENCE_TIME + "_sum") - (prefill + decode)) <= 0.01 * e2e
    ours = [delta("mindmotor_request_phase_seconds_sum", phase=p) for p in PHASES]
    assert all(delta("mindmotor_request_phase_seconds_count", phase=p) == n for p in PHASES)
    assert abs(sum(ours) - e2e) <= 0.01 * e2e
    assert abs(ours[PHASES.index("prefill")] - prefill) <= 1e-6 and abs(ours[PHASES.index("decode")] - decode) <= 1e-6

    # the engine figures (the instances' reports) come back to idle, and the steps' tokens are the
    # requests' computed tokens: prompts less cache hits, then every output token after the first
    # (made by the prompt's last step); one cache_config_info and one step histogram per instance
    computed = prompt - delta(V.PREFIX_CACHE_HITS + "_total") + generated - n

    def idle():
        s = samples(http)
        steps = total(s, V.ITERATION_TOKENS + "_sum", **m) - total(before, V.ITERATION_TOKENS + "_sum", **m)
        return total(s, V.NUM_REQUESTS_RUNNING, **m) == 0 and total(s, V.NUM_REQUESTS_WAITING, **m) == 0 \
            and steps == computed and s
    final = wait_until(idle, timeout=10, what="vllm:num_requests_running/waiting back to 0")
    assert 0 <= total(final, V.KV_CACHE_USAGE_PERC, **m) <= 1
    infos = [dict(ls) for (name, ls) in final if name == V.CACHE_CONFIG_INFO]
    assert len(infos) == 2 and all(i["block_size"].isdigit() and i["model_name"] == model_name for i in infos)
    assert len({i["engine"] for i in infos}) == 2
    engines = {dict(ls)["engine"] for (name, ls) in final if name == V.ITERATION_TOKENS + "_count"}
    assert engines == {i["engine"] for i in infos}
    assert total(final, V.ITERATION_TOKENS + "_bucket", le="+Inf") == total(final, V.ITERATION_TOKENS + "_count")
    assert total(final, "mindmotor_pending_queue_size") == 0
