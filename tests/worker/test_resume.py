"""Generate with a `continuation` (the request's instance failed after producing some output): the stream
carries only the new tokens and the text after what the client has, and equals the rest of an
undisturbed run — seeded sampling with penalties included."""

from __future__ import annotations

import pytest

from mindmotor.protocol import worker_pb2 as pb

from .rpc import request

PROMPT = "class Resumed:\n    def"
SEEDED = dict(temperature=1.0, top_p=0.9, seed=4321, presence_penalty=0.5, frequency_penalty=0.3,
              max_tokens=24, ignore_eos=True, logprobs=1)


def chunks(worker, req: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    return list(worker.stub.Generate(req, timeout=30))


@pytest.mark.parametrize("k", [1, 9, 23])
def test_a_resumed_request_streams_only_what_follows(worker, k):
    undisturbed = chunks(worker, request(PROMPT, **SEEDED))
    assert [len(c.token_ids) for c in undisturbed] == [1] * 24
    req = request(PROMPT, **SEEDED)
    req.continuation.output_token_ids.extend(t for c in undisturbed[:k] for t in c.token_ids)
    req.continuation.sent_chars = sum(len(c.text) for c in undisturbed[:k])

    got = chunks(worker, req)

    assert [c.token_ids for c in got] == [c.token_ids for c in undisturbed[k:]]
    assert [c.text for c in got] == [c.text for c in undisturbed[k:]]
    for mine, theirs in zip(got, undisturbed[k:]):                      # one logprob per new token
        ((lp,), (expected,)) = mine.logprobs, theirs.logprobs
        assert lp.token_id == expected.token_id and lp.logprob == pytest.approx(expected.logprob, abs=1e-4)
    assert got[-1].finish_reason == "length"
    assert got[-1].usage.completion_tokens == 24                       # the whole output
    assert got[-1].usage.prompt_tokens == undisturbed[-1].usage.prompt_tokens
