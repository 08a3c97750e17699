"""GenerateUnary: Generate's output as one answer (the coordinator's non-streamed requests), with
Generate's refusals, and a cancelled call aborts its request."""

from __future__ import annotations

import grpc
import pytest


from .rpc import collect, request
from .test_cancel_abort import LONG, idle_with_all_blocks_free
from .worker_process import wait_until


def test_unary_answer_is_the_stream_concatenated(worker):
    ask = dict(max_tokens=12, ignore_eos=True, logprobs=2, prompt_logprobs=1)
    streamed = collect(worker.stub.Generate(request("the same either way", **ask), timeout=30))
    whole = worker.stub.GenerateUnary(request("the same either way", request_id="unary-1", **ask), timeout=30)

    assert streamed.chunks > 1                      # the stream came in pieces; the unary answer is one
    assert whole.request_id == "unary-1"
    assert list(whole.token_ids) == streamed.token_ids and whole.text == streamed.text
    assert [lp.token_id for lp in whole.logprobs] == [lp.token_id for lp in streamed.logprobs]
    assert len(whole.prompt_logprobs) > 0
    assert whole.finish_reason == "length" and whole.usage.completion_tokens == 12
    assert whole.HasField("timings") and not whole.keepalive


def test_unary_refusals_are_generates(worker):
    with pytest.raises(grpc.RpcError) as refused:
        worker.stub.GenerateUnary(request([1, 2, 3], max_tokens=4, top_p=7.0), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "top_p" in refused.value.details()


def test_cancelling_a_unary_call_aborts_the_request(realtime_worker):
    w = realtime_worker
    call = w.stub.GenerateUnary.future(request("cancel me whole " * 20, request_id="unary-cancel", **LONG),
                                       timeout=30)
    wait_until(lambda: w.status().load.running == 1, timeout=10)

    call.cancel()

    wait_until(lambda: idle_with_all_blocks_free(w), timeout=5)
    wait_until(lambda: "request cancelled by the client" in w.log_text(), timeout=5)
    assert call.cancelled()
