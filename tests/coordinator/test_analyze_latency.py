"""`mindmotor analyze latency` against a running coordinator and a realtime worker (emulated
Llama-2-7B: ~15 ms per decode step): long outputs put the time into decode, long prompts with one
output token into prefill, and the analysis names that phase first; its shares add up, --plot draws
a PNG, --window sees only the requests of the window, and an unreachable coordinator is a clear
error."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from mindmotor.analysis.latency import breakdown, parse
from mindmotor.cli import main
from mindmotor.common.latency_phases import PHASES

from .processes import InProcessCoordinator


@pytest.fixture
def coordinator(realtime_worker, tiny_ckpt):
    c = InProcessCoordinator(workers=[realtime_worker.address], model_dir=str(tiny_ckpt))
    yield c
    c.stop()


def send(c, model: str, prompt: str, max_tokens: int, n: int = 3) -> None:
    with httpx.Client(base_url=c.url, timeout=60) as http, ThreadPoolExecutor(n) as pool:
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
        for r in pool.map(lambda i: http.post("/v1/completions", json={**body, "prompt": f"{i} {prompt}"}), range(n)):
            assert r.status_code == 200, r.text


def scrape(c) -> str:
    return httpx.get(c.url + "/metrics", timeout=10).text


def analyze(c, capsys, *args) -> list[dict]:
    capsys.readouterr()
    assert main(["analyze", "latency", "--url", c.url, "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_names_decode_then_prefill_as_the_top_phase(coordinator, model_name, capsys, tmp_path):
    send(coordinator, model_name, "a short prompt", max_tokens=24)
    (row,) = analyze(coordinator, capsys, "--plot", str(tmp_path / "latency.png"))
    assert row["model"] == model_name and row["class"] == "standard" and row["requests"] == 3
    assert row["top_phase"] == "decode", row
    assert {p["phase"] for p in row["phases"]} == set(PHASES)
    assert abs(sum(p["share"] for p in row["phases"]) - 1) < 1e-6
    assert abs(sum(p["mean_s"] for p in row["phases"]) - row["mean_e2e_s"]) < 1e-6
    assert set(row["vllm_mean_s"]) == {"queue", "prefill", "decode"}
    assert 0 <= row["slo_met"] <= 1          # the standard class has targets (TTFT 5 s, TPOT 0.2 s)
    assert (tmp_path / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # between two scrapes (what --window does), long prompts (~840 tokens) with one output token
    # each: prefill, and only those requests. (The worker's decode time of a one-token request is
    # its last output's way from the engine to the call, tens of ms on a busy host: the prompts are
    # long enough for their prefill to stay ahead of it.)
    before = parse(scrape(coordinator))
    send(coordinator, model_name, "the history of the world in many words " * 40, max_tokens=1)
    (row,) = breakdown(parse(scrape(coordinator)).minus(before))
    assert row.requests == 3 and row.top == "prefill", row


def test_text_output_and_errors(coordinator, model_name, capsys):
    send(coordinator, model_name, "x", max_tokens=4, n=1)
    capsys.readouterr()
    assert main(["analyze", "latency", "--url", coordinator.url]) == 0
    out = capsys.readouterr().out
    assert f"model {model_name}" in out and "top: " in out and "decode" in out
    with pytest.raises(SystemExit, match="cannot read http://127.0.0.1:9/metrics"):
        main(["analyze", "latency", "--url", "http://127.0.0.1:9", "--timeout", "2"])
    assert main(["analyze", "latency", "--url", coordinator.url, "--window", "-1"]) == 2


def test_a_fresh_coordinator_has_nothing_to_break_down_and_other_metrics_are_refused():
    from mindmotor.analysis.latency import MetricsError, render

    fresh = "# TYPE mindmotor_coordinator_requests_total counter\n"
    assert breakdown(parse(fresh)) == [] and "no finished requests" in render([])
    with pytest.raises(MetricsError, match="coordinator"):
        parse("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n")
