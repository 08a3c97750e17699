"""The P/D ratio policy wired end to end: workers report TTFT/TPOT p90 in their heartbeats, the
leader's sweeper decides, a `set_role` command reaches the worker, the routing table shows the new
role; alternating signals inside the sustain or dwell time switch nothing; every decision is
counted in /metrics.

Fake instances report canned latencies (fast, exact); one test runs real workers (tiny model,
virtual timing) whose own measured latencies miss a deliberately tiny TTFT target.
"""

from __future__ import annotations

import asyncio
import re

import grpc
import pytest

from mindmotor.common.roles import Role
from mindmotor.controller.pd_settings import DEFAULT_SLO, parse_slo
from mindmotor.model.testing import write_tiny_checkpoint
from mindmotor.protocol import worker_pb2 as pb
from mindmotor.protocol import worker_pb2_grpc
from mindmotor.runtime.child_process import ChildProcess

from .conftest import eventually

SUSTAIN_S = 0.6
PD_FLAGS = {"--pd-autoscale": None, "--pd-ttft-slo-ms": "100", "--pd-tpot-slo-ms": "50",
            "--pd-sustain": str(SUSTAIN_S), "--pd-dwell": "60", "--pd-every": "1"}


@pytest.fixture
def spawn_pd_controller(spawn_controller):
    """spawn_pd_controller(**flags) -> a controller with the P/D policy on (fast settings)."""
    return lambda **flags: spawn_controller(extra={**PD_FLAGS, **flags})


def decisions(ctrl) -> dict[tuple[str, str], float]:
    text = ctrl.get("/metrics").text
    found = re.findall(r'mindmotor_controller_pd_decisions_total\{action="(\w+)",reason="(\w+)"\} (\S+)', text)
    return {(action, reason): float(value) for action, reason, value in found}


def roles(ctrl) -> dict[str, str]:
    return {i: r["role"] for i, r in ctrl.instances().items()}


def slow_prefill(instance) -> None:
    """TTFT at 3× its 100 ms target, TPOT at 0.2× its 50 ms target."""
    instance.load.ttft_p90_s, instance.load.ttft_samples = 0.3, 20
    instance.load.tpot_p90_s, instance.load.tpot_samples = 0.01, 20


def slow_decode(instance) -> None:
    instance.load.ttft_p90_s, instance.load.ttft_samples = 0.02, 20
    instance.load.tpot_p90_s, instance.load.tpot_samples = 0.2, 20


def test_slo_flag_parsing():
    assert parse_slo("deployment=chat,ttft_ms=500,tpot_ms=40", DEFAULT_SLO) == (("deployment", "chat"),
                                                                                 type(DEFAULT_SLO)(0.5, 0.04))
    key, slo = parse_slo("model=m, tpot_ms=20", DEFAULT_SLO)
    assert key == ("model", "m") and slo.ttft_s == DEFAULT_SLO.ttft_s and slo.tpot_s == 0.02
    for bad in ("ttft_ms=5", "deployment=a,model=b", "deployment=a,ttft_ms=x", "deployment=a,foo=1",
                "deployment=a,ttft_ms=0"):
        with pytest.raises(ValueError):
            parse_slo(bad, DEFAULT_SLO)


@pytest.mark.asyncio
async def test_sustained_ttft_miss_turns_a_decode_instance_into_prefill(spawn_pd_controller, make_instance,
                                                                         make_watcher):
    ctrl = spawn_pd_controller()
    watcher = await make_watcher(ctrl.address)
    p0 = await make_instance(ctrl.address, "p0", role="prefill")
    d0 = await make_instance(ctrl.address, "d0", role="decode")
    d1 = await make_instance(ctrl.address, "d1", role="decode")
    d1.load.running = 7                                  # d0 is the least loaded decode instance
    for instance in (p0, d0, d1):
        slow_prefill(instance)

    table = await watcher.wait_for(
        lambda t: {(i.instance_id, Role.from_proto(i.role), i.state) for i in t.instances} >=
        {("p0", "prefill", "ready"), ("d0", "prefill", "ready"), ("d1", "decode", "ready")}, timeout=10)
    assert d0.roles == ["prefill"] and d1.roles == [] and p0.roles == []
    assert len(table.instances) == 3

    counted = await eventually(lambda: decisions(ctrl).get(("none", "last_instance")) and decisions(ctrl), 5)
    assert counted[("to_prefill", "ttft_miss")] == 1.0 and counted[("none", "sustaining")] >= 1
    assert not any(action == "to_decode" for action, _ in counted)
    metrics = ctrl.get("/metrics").text
    assert 'mindmotor_controller_pd_ratio{deployment="",model="tiny"} 2.0' in metrics
    assert 'mindmotor_controller_pd_ttft_p90_seconds{deployment="",model="tiny"} 0.3' in metrics
    assert "mindmotor_controller_pd_tpot_p90_seconds" in metrics
    record = ctrl.instances()["d0"]
    assert record["ttft_p90_s"] == pytest.approx(0.3) and record["tpot_samples"] == 20


@pytest.mark.asyncio
async def test_alternating_signals_do_not_flap(spawn_pd_controller, make_instance):
    ctrl = spawn_pd_controller(**{"--pd-sustain": "1.0"})
    fleet = [await make_instance(ctrl.address, i, role=role)
             for i, role in (("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"), ("d1", "decode"))]
    before = roles(ctrl)
    # the signal flips every 0.4 s, well inside the 1 s sustain time: wishes restart, nothing switches
    for flip in range(8):
        for instance in fleet:
            (slow_prefill if flip % 2 == 0 else slow_decode)(instance)
        await asyncio.sleep(0.4)
    counted = decisions(ctrl)
    assert counted.get(("none", "sustaining"), 0) >= 4
    assert not any(action != "none" for action, _ in counted)
    assert all(not i.roles for i in fleet) and roles(ctrl) == before

    # one sustained miss switches once; the opposite miss right after is held back by the dwell time
    for instance in fleet:
        slow_prefill(instance)
    await eventually(lambda: decisions(ctrl).get(("to_prefill", "ttft_miss")), 5)
    await eventually(lambda: list(roles(ctrl).values()).count("prefill") == 3, 5)
    for instance in fleet:
        slow_decode(instance)
    await eventually(lambda: decisions(ctrl).get(("none", "dwell"), 0) >= 3, 10)
    counted = decisions(ctrl)
    assert ("to_decode", "tpot_miss") not in counted and counted[("to_prefill", "ttft_miss")] == 1.0
    assert sum(len(i.roles) for i in fleet) == 1


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("pd-model"))


def worker_stub(address: str) -> worker_pb2_grpc.WorkerStub:
    return worker_pb2_grpc.WorkerStub(grpc.insecure_channel(address))


def test_real_workers_report_latency_and_obey_the_switch(spawn_pd_controller, tiny_model, tmp_path):
    # a TTFT target no real request can meet, a TPOT target every request meets
    ctrl = spawn_pd_controller(**{"--pd-ttft-slo-ms": "0.001", "--pd-tpot-slo-ms": "100000"})
    workers = {}
    try:
        for worker_id, role in (("p0", "prefill"), ("d0", "decode"), ("d1", "decode")):
            workers[worker_id] = ChildProcess(worker_id, [
                "worker", "--model", str(tiny_model), "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
                "--timing", "virtual", "--worker-id", worker_id, "--role", role, "--controller", ctrl.address],
                "MINDMOTOR_WORKER_READY", tmp_path / f"{worker_id}.log")
        stubs = {w: worker_stub(f"127.0.0.1:{p.wait_ready(60)['port']}") for w, p in workers.items()}
        for stub in stubs.values():
            req = pb.GenerateRequest(prompt_text="measure me", sampling=pb.SamplingParams(temperature=0, max_tokens=4))
            assert sum(len(c.token_ids) for c in stub.Generate(req, timeout=30)) == 4

        switched = _wait(lambda: [w for w in ("d0", "d1") if stubs[w].Status(pb.StatusRequest()).role == Role.PREFILL.to_proto()])
        assert len(switched) == 1
        _wait(lambda: roles(ctrl)[switched[0]] == "prefill" and ctrl.instances()[switched[0]]["state"] == "ready")
        record = ctrl.instances()["p0"]
        assert record["ttft_samples"] >= 1 and record["ttft_p90_s"] > 0
        assert decisions(ctrl)[("to_prefill", "ttft_miss")] == 1.0
    finally:
        for process in workers.values():
            process.kill()


def _wait(check, timeout: float = 20.0):
    import time

    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.05)
    return value
