"""The serving benchmark and the coordinator-overhead benchmark against a real tiny platform (one
virtual-timing worker + a coordinator, free ports, stopped at teardown), plus unit tests of the SSE
parser, the statistics and the workload builders."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import coordinator_overhead as co  # noqa: E402
from loadtest import bench_serving as bs  # noqa: E402
from mindmotor.model.testing import write_tiny_checkpoint  # noqa: E402


# ---- units -------------------------------------------------------------------------------------
def test_sse_parser_split_chunks_crlf_comments_and_multiline():
    p = bs.SSEParser()
    stream = (b": keep-alive\r\n\r\n"
              b"data: {\"a\": 1}\r\n\r\n"
              b"event: x\ndata: line1\ndata:line2\n\n"
              b"data: [DONE]\n\n"
              b"data: tail")
    events = []
    for i in range(0, len(stream), 3):           # every split point inside lines and separators
        events += p.feed(stream[i:i + 3])
    assert events == ['{"a": 1}', "line1\nline2", "[DONE]"]
    assert p.close() == ["tail"]
    assert p.close() == []


def test_chunk_text_for_both_endpoints():
    assert bs.chunk_text({"choices": [{"text": "ab"}]}, chat=False) == "ab"
    assert bs.chunk_text({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, chat=True) == ""
    assert bs.chunk_text({"choices": [{"delta": {"content": "x"}}]}, chat=True) == "x"
    assert bs.chunk_text({"choices": [], "usage": {"completion_tokens": 3}}, chat=False) == ""


def test_a_chunk_of_held_back_tokens_counts_when_logprobs_show_them():
    """With logprobs every token arrives in a chunk, also one whose text the server holds back
    (an incomplete UTF-8 character): it is a token for TTFT/ITL, though it has no text."""
    held = {"choices": [{"text": "", "logprobs": {"tokens": ["bytes:\\xe4"], "token_logprobs": [-0.1]}}]}
    assert bs.chunk_carries_tokens(held, chat=False)
    assert bs.chunk_carries_tokens({"choices": [{"delta": {"content": ""}, "logprobs": {"content": [{}]}}]},
                                   chat=True)
    assert not bs.chunk_carries_tokens({"choices": [{"text": "", "logprobs": None, "finish_reason": "length"}]},
                                       chat=False)
    assert not bs.chunk_carries_tokens({"choices": [], "usage": {"completion_tokens": 3}}, chat=False)
    assert bs.chunk_carries_tokens({"choices": [{"text": "ab"}]}, chat=False)


def _result(ttft, e2el, out, send=0.0, ok=True, error="", itl=()):
    return bs.RequestResult(success=ok, error=error, prompt_len=10, output_len=out, prompt_tokens=10,
                            output_tokens=out if ok else None, send_s=send, ttft_s=ttft if ok else None,
                            e2el_s=e2el if ok else None, itl_s=list(itl), chunk_s=[send + ttft] if ok else [])


def test_stats_tpot_percentiles_goodput_and_errors():
    results = [_result(0.1, 1.1, 11, itl=[0.1] * 10), _result(0.2, 2.2, 11, itl=[0.2] * 10),
               _result(0.3, 0.3, 1), _result(0, 0, 5, ok=False, error="http_429")]
    assert results[0].tpot_s == pytest.approx(0.1)
    assert results[2].tpot_s is None                     # one token: no TPOT
    m = bs.compute_metrics(results, duration_s=2.0, percentiles=[50, 99],
                           slos=bs.parse_goodput(["ttft:250", "tpot:150"]))
    assert m["completed"] == 3 and m["failed"] == 1 and m["errors"] == {"http_429": 1}
    assert m["total_output_tokens"] == 23 and m["output_throughput"] == pytest.approx(11.5)
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["ttft_ms"]["mean"] == pytest.approx(200.0) and m["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert m["tpot_ms"]["p50"] == pytest.approx(150.0)   # 100 and 200 ms
    assert m["e2el_ms"]["p99"] == pytest.approx(np.percentile([1100, 2200, 300], 99))
    assert m["itl_ms"]["mean"] == pytest.approx(150.0)
    # within SLOs: #1 (ttft 100, tpot 100) and #3 (ttft 300 > 250: no) -> 1 of 4
    assert m["goodput"]["good_requests"] == 1 and m["goodput"]["request_goodput"] == pytest.approx(0.5)
    assert m["output_tokens_as_asked"] == 3
    empty = bs.distribution([], [50])
    assert empty == {"mean": None, "std": None, "p50": None}
    with pytest.raises(ValueError):
        bs.parse_goodput(["latency:5"])


def test_arrivals_and_lengths_and_trace_window():
    rng = np.random.default_rng(0)
    assert bs.poisson_offsets(rng, 4, math.inf) == [0.0] * 4
    offs = bs.poisson_offsets(np.random.default_rng(1), 4000, 20.0)
    assert offs[0] == 0.0 and all(b >= a for a, b in zip(offs, offs[1:]))
    assert 4000 / offs[-1] == pytest.approx(20.0, rel=0.1)
    lens = bs.uniform_lengths(rng, 500, 100, 0.5)
    assert min(lens) >= 50 and max(lens) <= 150
    rows = bs.trace_workload(np.random.default_rng(2), 50, length_scale=0.1, max_input=300, max_output=40,
                             time_scale=2.0)
    assert len(rows) == 50 and rows[0][2] == 0.0
    assert all(1 <= p <= 300 and 1 <= o <= 40 for p, o, _ in rows)
    assert all(b[2] >= a[2] for a, b in zip(rows, rows[1:]))
    sampled = bs.trace_workload(np.random.default_rng(2), 5, length_scale=1.0, max_input=3072,
                                max_output=1024, time_scale=None)
    assert all(t is None for _, _, t in sampled)


def test_prompt_maker_exact_lengths_with_tokenizer(tiny_model):
    maker = bs.PromptMaker(np.random.default_rng(0), str(tiny_model))
    for n in (1, 7, 40, 200):
        assert maker.count(maker.make(n)) == n


# ---- against a running platform ----------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("lt") / "tiny-lt")


@pytest.fixture(scope="module")
def platform(tiny_model, tmp_path_factory):
    """A virtual-timing worker and a coordinator on free ports; stopped (or killed) at teardown."""
    logs = tmp_path_factory.mktemp("lt-logs")
    started = []
    try:
        worker = co.start_worker(str(tiny_model), logs)
        started.append(worker)
        coord = co.start_coordinator(worker.port, tiny_model.name, str(tiny_model), logs)
        started.append(coord)
        yield {"worker": worker, "coordinator": coord, "url": f"http://127.0.0.1:{coord.port}",
               "model": tiny_model.name}
    finally:
        for s in reversed(started):
            s.stop(timeout_s=10)
        assert all(s.proc.poll() is not None for s in started)


def _args(**over) -> argparse.Namespace:
    args = bs.build_parser().parse_args([])
    args.disable_tqdm = True
    for k, v in over.items():
        setattr(args, k, v)
    return args


@pytest.mark.timeout(60)
@pytest.mark.parametrize("endpoint,logprobs", [("/v1/completions", None), ("/v1/chat/completions", None),
                                               ("/v1/completions", 0), ("/v1/chat/completions", 0)])
def test_bench_serving_core_against_platform(platform, tiny_model, endpoint, logprobs, tmp_path):
    args = _args(base_url=platform["url"], endpoint=endpoint, num_prompts=10, request_rate=50.0, input_len=24,
                 output_len=6, output_len_range_ratio=0.5, tokenizer=str(tiny_model), seed=3,
                 goodput=["ttft:60000", "e2el:60000"], logprobs=logprobs)
    result = asyncio.run(bs.run_benchmark(args))
    m = result["metrics"]
    assert m["completed"] == 10 and m["failed"] == 0 and m["errors"] == {}
    assert m["output_tokens_as_asked"] == 10                       # ignore_eos: exactly max_tokens
    asked = [r["output_len"] for r in result["requests"]]
    assert m["total_output_tokens"] == sum(asked)
    if endpoint == "/v1/completions":                            # the tokenizer made exact prompts
        assert [r["prompt_tokens"] for r in result["requests"]] == [24] * 10
    for r in result["requests"]:
        assert 0 < r["ttft_s"] <= r["e2el_s"]
        assert len(r["itl_s"]) == len(r["chunk_s"]) - 1
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert set(m[key]) == {"mean", "std", "p50", "p90", "p99"}
    assert m["ttft_ms"]["p50"] <= m["e2el_ms"]["p50"]
    assert m["request_throughput"] > 0 and m["output_throughput"] > 0
    assert m["goodput"]["good_requests"] == 10
    line = bs.headline(result)
    json.loads(json.dumps(line))
    for key in ("completed", "failed", "request_throughput", "output_throughput", "ttft_ms", "tpot_ms",
                "itl_ms", "e2el_ms", "goodput", "model", "endpoint"):
        assert key in line
    bs.plot(result, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 1000


@pytest.mark.timeout(60)
def test_bench_serving_main_counts_errors_and_prints_json_last(platform, capsys):
    """A request the server refuses (prompt + max_tokens over the context: 400) is counted, not fatal;
    the last stdout line is one JSON object."""
    rc = bs.main(["--base-url", platform["url"], "--num-prompts", "3", "--input-len", "8", "--output-len", "5000",
                  "--disable-tqdm", "--warmup-requests", "0"])
    assert rc == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["completed"] == 0 and last["failed"] == 3 and last["errors"] == {"http_400": 3}
    assert last["ttft_ms"]["p50"] is None
    assert last["request_rate"] == "inf"


@pytest.mark.timeout(60)
def test_bench_serving_unreachable_server_is_reported(capsys):
    rc = bs.main(["--base-url", "http://127.0.0.1:9", "--num-prompts", "2", "--disable-tqdm",
                  "--request-timeout", "5"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 1 and "error" in last


@pytest.mark.timeout(60)
def test_coordinator_overhead_core_tiny(platform):
    worker, coord = platform["worker"], platform["coordinator"]
    lat = asyncio.run(co.measure_added_latency(worker.port, {"coordinator": coord.port}, platform["model"],
                                               n=6, warmup=2))
    assert lat["n"] == 6
    for path in ("direct", "coordinator"):
        assert 0 < lat[path]["p50_ms"] <= lat[path]["p90_ms"]
    assert lat["coordinator"]["added_p50_ms"] == pytest.approx(lat["coordinator"]["p50_ms"] - lat["direct"]["p50_ms"])
    body = co.completion_body(platform["model"], 1)
    res = co.interleaved({"coordinator": (coord.port, {"coordinator": coord, "worker": worker})}, body, [1, 4],
                         reps=1, duration_s=0.4, warmup_s=0.1)["coordinator"]
    assert [r["concurrency"] for r in res["levels"]] == [1, 4]
    assert res["max_rps"] > 0 and all(not r["errors"] for r in res["levels"])
    assert all(r["cpu_cores"]["coordinator"] >= 0 for r in res["levels"])
    assert co.best_under_p99(res["levels"], 1e9) is not None
    assert co.finite({"a": [float("nan"), 1.0]}) == {"a": [None, 1.0]}
