"""Streamed Generate against the offline engine, concurrency, stop reasons."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from mindmotor import LLM, SamplingParams

from .rpc import collect, request

# Prompts used only here, so the worker's prefix cache holds nothing of them beforehand.
PROMPTS = ["def fibonacci(n):", "The quick brown fox", "import json\nclass Decoder:"]


@pytest.fixture(scope="module")
def offline(tiny_model):
    return LLM(model=str(tiny_model))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_stream_equals_offline_generate(worker, offline, prompt):
    params = SamplingParams(temperature=0.0, max_tokens=40, logprobs=3)
    expected = offline.generate(prompt, params)[0]

    got = collect(worker.stub.Generate(request(prompt, max_tokens=40, logprobs=3), timeout=30))

    assert got.token_ids == expected.token_ids
    assert got.text == expected.text
    assert got.finish_reason == expected.finish_reason
    assert [lp.token_id for lp in got.logprobs] == expected.token_ids
    for mine, theirs in zip(got.logprobs, expected.logprobs):
        assert mine.logprob == pytest.approx(theirs.logprob, abs=1e-5)
        assert [t.token_id for t in mine.top] == [t for t, _ in theirs.top]
    usage = got.last.usage
    assert usage.prompt_tokens == len(expected.prompt_token_ids)
    assert usage.completion_tokens == len(expected.token_ids)


def test_token_id_prompt_streams_like_the_text_prompt(worker, offline):
    ids = offline.tokenizer.encode("Hello, world! Hello")
    expected = offline.generate([ids], SamplingParams(temperature=0.0, max_tokens=12))[0]

    got = collect(worker.stub.Generate(request(ids, max_tokens=12), timeout=30))

    assert got.token_ids == expected.token_ids
    assert got.last.usage.prompt_tokens == len(ids)


def test_one_chunk_per_token_and_usage_only_at_the_end(worker):
    chunks = list(worker.stub.Generate(request("chunks", request_id="chunky", max_tokens=8,
                                               ignore_eos=True), timeout=30))

    assert len(chunks) == 8
    assert all(c.request_id == "chunky" for c in chunks)
    assert all(len(c.token_ids) == 1 for c in chunks)
    assert [c.finish_reason for c in chunks] == [""] * 7 + ["length"]
    assert not any(c.HasField("usage") for c in chunks[:-1])
    assert chunks[-1].usage.completion_tokens == 8


def test_worker_names_a_request_without_an_id(worker):
    got = collect(worker.stub.Generate(request("no id", max_tokens=2), timeout=30))
    (rid,) = got.request_ids
    assert len(rid) >= 16


def test_stop_token_id_is_reported(worker, offline):
    free = offline.generate("stop here", SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))[0]
    stop_at = free.token_ids[3]

    got = collect(worker.stub.Generate(request("stop here", max_tokens=10, ignore_eos=True,
                                               stop_token_ids=[stop_at]), timeout=30))

    assert got.finish_reason == "stop"
    assert got.last.WhichOneof("stop_reason") == "stop_token_id"
    assert got.last.stop_token_id == stop_at
    assert got.token_ids == free.token_ids[:free.token_ids.index(stop_at) + 1]


def test_seeded_sampling_is_reproducible(worker):
    def sample():
        return collect(worker.stub.Generate(request("seeded", temperature=1.0, top_p=0.9, top_k=50,
                                                    seed=1234, max_tokens=16, ignore_eos=True),
                                            timeout=30)).token_ids

    assert sample() == sample()


def test_concurrent_streams_each_get_their_own_tokens(worker):
    lengths = [5, 9, 13, 17, 21, 25, 29, 33]

    def run(i: int):
        return collect(worker.stub.Generate(
            request(f"concurrent request number {i}", request_id=f"conc-{i}", max_tokens=lengths[i],
                    ignore_eos=True), timeout=60))

    with ThreadPoolExecutor(len(lengths)) as pool:
        results = list(pool.map(run, range(len(lengths))))

    for i, got in enumerate(results):
        assert got.request_ids == {f"conc-{i}"}
        assert len(got.token_ids) == lengths[i] == got.last.usage.completion_tokens
        assert got.finish_reason == "length"


def test_unset_max_tokens_runs_to_the_end_of_the_context(worker):
    got = collect(worker.stub.Generate(request([7] * 1000, ignore_eos=True), timeout=30))

    assert got.finish_reason == "length"
    assert got.last.usage.completion_tokens == 1024 - 1000
