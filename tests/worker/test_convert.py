"""Proto <-> engine conversions (no process)."""

from __future__ import annotations

import pytest

from mindmotor.engine.output import RequestOutput
from mindmotor.engine.sampler import TokenLogprob
from mindmotor.protocol import worker_pb2 as pb
from mindmotor.worker.convert import prompt_from_request, response_from_output, sampling_params_from_proto


def test_unset_optional_fields_keep_the_engine_defaults():
    params = sampling_params_from_proto(pb.SamplingParams())
    assert params.temperature == 1.0 and params.top_p == 1.0 and params.top_k == -1
    assert params.max_tokens is None and params.seed is None and params.logprobs is None


def test_set_fields_reach_the_engine():
    params = sampling_params_from_proto(pb.SamplingParams(
        max_tokens=7, temperature=0.0, top_p=0.5, top_k=3, seed=2**63 - 1, stop=["\n\n"], stop_token_ids=[4],
        ignore_eos=True, min_tokens=2, presence_penalty=0.5, frequency_penalty=-0.5, logprobs=0,
        include_stop_str_in_output=True))
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k, params.seed) == (7, 0.0, 0.5, 3, 2**63 - 1)
    assert params.stop == ["\n\n"] and params.stop_token_ids == [4] and params.logprobs == 0
    assert params.ignore_eos and params.include_stop_str_in_output and params.min_tokens == 2
    assert params.presence_penalty == 0.5 and params.frequency_penalty == -0.5


def test_prompt_is_text_or_ids_or_an_error():
    assert prompt_from_request(pb.GenerateRequest(prompt_text="hi")) == "hi"
    assert prompt_from_request(pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=[1, 2]))) == [1, 2]
    with pytest.raises(ValueError, match="no prompt"):
        prompt_from_request(pb.GenerateRequest())


def test_last_chunk_carries_finish_stop_reason_and_usage():
    out = RequestOutput("r", [5], "x", finished=True, finish_reason="stop", stop_reason="\n",
                        num_prompt_tokens=4, num_output_tokens=2, num_cached_tokens=1,
                        new_logprobs=[TokenLogprob(5, -0.5, [(5, -0.5), (6, -1.5)])])
    chunk = response_from_output(out)
    assert chunk.finish_reason == "stop" and chunk.stop_string == "\n"
    assert (chunk.usage.prompt_tokens, chunk.usage.completion_tokens, chunk.usage.cached_tokens) == (4, 2, 1)
    assert [(t.token_id, t.logprob) for t in chunk.logprobs[0].top] == [(5, -0.5), (6, -1.5)]
    by_token = response_from_output(RequestOutput("r", [2], "", True, "stop", stop_reason=2))
    assert by_token.WhichOneof("stop_reason") == "stop_token_id" and by_token.stop_token_id == 2


def test_middle_chunk_has_no_finish_and_no_usage():
    chunk = response_from_output(RequestOutput("r", [5], "x", finished=False))
    assert chunk.finish_reason == "" and not chunk.HasField("usage") and chunk.WhichOneof("stop_reason") is None


def test_vllm_fields_reach_the_engine():
    params = sampling_params_from_proto(pb.SamplingParams(
        min_p=0.25, repetition_penalty=1.5, logit_bias={7: -100.0, 9: 2.5}, allowed_token_ids=[3, 4],
        bad_words=["foo bar"]))
    assert params.min_p == 0.25 and params.repetition_penalty == 1.5
    assert params.logit_bias == {7: -100.0, 9: 2.5} and params.allowed_token_ids == [3, 4]
    assert params.bad_words == ["foo bar"]
    unset = sampling_params_from_proto(pb.SamplingParams())
    assert unset.repetition_penalty == 1.0 and unset.allowed_token_ids is None and not unset.logit_bias
