"""The prefill/decode split between two real worker processes: Prefill on one, Generate with
a continuation with a `kv_source` on the other (which pulls the KV worker-to-worker) — greedy tokens and text
identical to a mixed worker; a failed pull falls back to prefilling on the decode worker; a prefill
worker that dies after the handover does not disturb the stream; pins are released or expire;
roles switch at run time."""

from __future__ import annotations

import grpc
import pytest
import httpx

from mindmotor.common.roles import Role
from mindmotor.protocol import worker_pb2 as pb

from .rpc import collect, request
from .worker_process import wait_until

PROMPT = "The prefill instance computes the prompt, and the decode instance continues the story"
SAMPLING = dict(max_tokens=24, ignore_eos=True)


def prefill(worker, prompt=PROMPT, **sampling) -> pb.PrefillResponse:
    req = request(prompt, **{**SAMPLING, **sampling})
    out = pb.PrefillRequest(prompt_text=req.prompt_text, sampling=req.sampling)
    return worker.stub.Prefill(out, timeout=30)


def decode_request(first: pb.PrefillResponse, address: str, handle: str | None = None, **sampling):
    req = request(list(first.prompt_token_ids), **{**SAMPLING, **sampling})
    req.continuation.output_token_ids.append(first.token_ids[0])
    req.continuation.sent_chars = len(first.text)
    req.continuation.kv_source.CopyFrom(pb.KVSource(
        address=address, handle=first.handle if handle is None else handle, node=first.node))
    return req


def metric(worker, name: str) -> float:
    total = 0.0
    for line in httpx.get(worker.metrics_url, timeout=5).text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def reference(worker):
    """The mixed worker's greedy output for PROMPT."""
    return collect(worker.stub.Generate(request(PROMPT, **SAMPLING), timeout=30))


@pytest.fixture
def pd_pair(start_worker):
    return (start_worker("--timing", "virtual", "--role", "prefill", "--kv-pin-timeout", "2"),
            start_worker("--timing", "virtual", "--role", "decode", "--kv-pull-timeout", "2"))


def test_split_equals_mixed_and_survives_the_prefill_worker_dying(pd_pair, reference):
    p, d = pd_pair
    assert p.stub.Status(pb.StatusRequest(), timeout=5).role == Role.PREFILL.to_proto()
    first = prefill(p)
    assert first.handle and not first.finish_reason and first.num_blocks > 0
    assert p.stub.Status(pb.StatusRequest(), timeout=5).load.kv_pinned == 1
    stream = d.stub.Generate(decode_request(first, p.address), timeout=30)
    head = next(stream)                                   # the KV is pulled before the first token
    p.proc.kill()                                         # the prefill worker dies after the handover
    rest = collect(stream)
    tokens = list(first.token_ids) + list(head.token_ids) + rest.token_ids
    assert tokens == reference.token_ids
    assert first.text + head.text + rest.text == reference.text
    assert rest.finish_reason == "length" and rest.last.usage.completion_tokens == SAMPLING["max_tokens"]
    load = d.stub.Status(pb.StatusRequest(), timeout=5).load
    assert load.kv_transfers == 1 and load.kv_transfer_s > 0
    assert metric(d, 'mindmotor_kv_transfers_total{outcome="pulled"}') == 1
    assert metric(d, "mindmotor_kv_transfer_bytes_total") > 0


def test_release_after_pull_and_pin_timeout(pd_pair, reference):
    p, d = pd_pair
    first = prefill(p)
    collect(d.stub.Generate(decode_request(first, p.address), timeout=30))
    wait_until(lambda: p.stub.Status(pb.StatusRequest(), timeout=5).load.kv_pinned == 0, timeout=5)
    with pytest.raises(grpc.RpcError) as err:                      # released: nothing left to pull
        list(p.stub.PullKV(pb.PullKVRequest(handle=first.handle), timeout=5))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    orphan = prefill(p)                                            # nobody pulls: the pin times out
    assert p.stub.Status(pb.StatusRequest(), timeout=5).load.kv_pinned == 1
    wait_until(lambda: p.stub.Status(pb.StatusRequest(), timeout=5).load.kv_pinned == 0, timeout=6)
    assert not p.stub.ReleaseKV(pb.ReleaseKVRequest(handle=orphan.handle), timeout=5).found


def test_failed_pull_falls_back_to_local_prefill(pd_pair, reference):
    p, d = pd_pair
    first = prefill(p)
    unknown = collect(d.stub.Generate(decode_request(first, p.address, handle="no-such-handle"), timeout=30))
    assert list(first.token_ids) + unknown.token_ids == reference.token_ids
    assert first.text + unknown.text == reference.text
    p.proc.kill()                                                  # unreachable prefill instance
    p.proc.wait(timeout=10)
    gone = collect(d.stub.Generate(decode_request(first, p.address), timeout=30))
    assert list(first.token_ids) + gone.token_ids == reference.token_ids
    assert metric(d, 'mindmotor_kv_transfers_total{outcome="fallback"}') == 2


def test_first_token_that_finishes_returns_no_handle(worker):
    first = prefill(worker, max_tokens=1)
    assert first.handle == "" and first.finish_reason == "length" and len(first.token_ids) == 1
    assert worker.stub.Status(pb.StatusRequest(), timeout=5).load.kv_pinned == 0


def test_set_role_switches_after_draining(worker):
    response = worker.stub.SetRole(pb.SetRoleRequest(role=Role.DECODE.to_proto()), timeout=10)
    try:
        assert (Role.from_proto(response.previous_role), Role.from_proto(response.role), response.drained) == \
            (Role.MIXED, Role.DECODE, True)
        status = worker.stub.Status(pb.StatusRequest(), timeout=5)
        assert Role.from_proto(status.role) == Role.DECODE and status.state == "serving"
        assert metric(worker, 'mindmotor_worker_role{role="decode"}') == 1
    finally:
        worker.stub.SetRole(pb.SetRoleRequest(role=Role.MIXED.to_proto()), timeout=10)
    for unknown in (0, 99):                     # ROLE_UNSPECIFIED, a value this version does not know
        with pytest.raises(grpc.RpcError) as err:
            worker.stub.SetRole(pb.SetRoleRequest(role=unknown), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "role" in err.value.details()
