"""The P/D ratio policy wired end to end: workers report TTFT/TPOT p90 in their heartbeats, the
leader's sweeper decides, a `set_role` command reaches the worker, the routing table shows the new
role; alternating signals inside the sustain or dwell time switch nothing; every decision is
counted in /metrics.

Fake instances report canned latencies (fast, exact); one test runs real workers (tiny model,
virtual timing) whose own measured latencies miss a deliberately tiny TTFT target. Where time is the
subject (sustain and dwell), the leader's policy runs in-process on a `FakeClock` (`PDFleet`).
"""

from __future__ import annotations

import re

import pytest

from fake_clock import FakeClock
from mindmotor.common.roles import Role
from mindmotor.common.store import MemoryStore
from mindmotor.common.waiting import wait_until
from mindmotor.controller.config import ControllerConfig
from mindmotor.controller.metrics import ControllerMetrics
from mindmotor.controller.pd_autoscaler import PDAutoscaler
from mindmotor.controller.pd_settings import DEFAULT_SLO, parse_slo
from mindmotor.controller.registry import Registry
from mindmotor.model.testing import write_tiny_checkpoint
from mindmotor.protocol import controller_pb2
from mindmotor.protocol import worker_pb2 as pb
from service_processes import WorkerProcess

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


class PDFleet:
    """The leader's P/D policy in-process on a `FakeClock`: a registry (memory store), the
    `PDAutoscaler`, and instances that heartbeat every 0.2 s of fake time with canned latencies and
    obey a `set_role` command the way a worker does (the next heartbeat reports the new role)."""

    def __init__(self, roles: dict[str, str], **settings):
        self.clock = FakeClock(1000.0)
        self.registry = Registry(MemoryStore(prefix="t:"), clock=self.clock)
        self.config = ControllerConfig(**{"heartbeat_interval_s": 0.2, "pd_autoscale": True, "pd_ttft_slo_ms": 100,
                                          "pd_tpot_slo_ms": 50, "pd_sustain_s": SUSTAIN_S, "pd_dwell_s": 60,
                                          "pd_every": 1, **settings})
        self.metrics = ControllerMetrics("c1")
        self.autoscaler = PDAutoscaler(self.registry, self.config, self.metrics)
        self.roles = dict(roles)
        self.obeyed: list[tuple[str, str]] = []
        self.latency = {"ttft_p90_s": 0.0, "ttft_samples": 0, "tpot_p90_s": 0.0, "tpot_samples": 0}

    async def start(self) -> "PDFleet":
        for n, (instance_id, role) in enumerate(self.roles.items()):
            await self.registry.register(controller_pb2.RegisterRequest(
                instance_id=instance_id, address=f"10.0.0.1:{9000 + n}", model="tiny", role=Role(role).to_proto()))
        await self.heartbeats()
        return self

    def slow_prefill(self) -> None:
        """TTFT at 3× its 100 ms target, TPOT at 0.2× its 50 ms target."""
        self.latency = {"ttft_p90_s": 0.3, "ttft_samples": 20, "tpot_p90_s": 0.01, "tpot_samples": 20}

    def slow_decode(self) -> None:
        self.latency = {"ttft_p90_s": 0.02, "ttft_samples": 20, "tpot_p90_s": 0.2, "tpot_samples": 20}

    async def heartbeats(self) -> None:
        for instance_id, role in self.roles.items():
            outcome = await self.registry.heartbeat(controller_pb2.HeartbeatRequest(
                instance_id=instance_id, state="serving", role=Role(role).to_proto(), **self.latency), None)
            for command in outcome.commands:
                if "set_role" in command:
                    self.roles[instance_id] = command["set_role"]["role"]
                    self.obeyed.append((instance_id, self.roles[instance_id]))

    async def run_for(self, seconds: float) -> None:
        """`seconds` of fake time: a heartbeat round and (when due) a policy evaluation every 0.2 s."""
        for _ in range(round(seconds / self.config.heartbeat_interval_s)):
            self.clock.advance(self.config.heartbeat_interval_s)
            await self.heartbeats()
            if self.autoscaler.due(self.clock()):
                await self.autoscaler.evaluate(self.clock())

    def decisions(self) -> dict[tuple[str, str], float]:
        return {(s.labels["action"], s.labels["reason"]): s.value
                for metric in self.metrics.registry.collect() if metric.name == "mindmotor_controller_pd_decisions"
                for s in metric.samples if s.name.endswith("_total")}


@pytest.mark.asyncio
async def test_alternating_signals_do_not_flap():
    fleet = await PDFleet({"p0": "prefill", "p1": "prefill", "d0": "decode", "d1": "decode"},
                          pd_sustain_s=1.0).start()
    before = dict(fleet.roles)
    # the signal flips every 0.4 s, well inside the 1 s sustain time: wishes restart, nothing switches
    for flip in range(8):
        (fleet.slow_prefill if flip % 2 == 0 else fleet.slow_decode)()
        await fleet.run_for(0.4)
    counted = fleet.decisions()
    assert counted.get(("none", "sustaining"), 0) >= 4
    assert not any(action != "none" for action, _ in counted)
    assert not fleet.obeyed and fleet.roles == before

    # one sustained miss switches once; the opposite miss right after is held back by the dwell time
    fleet.slow_prefill()
    await fleet.run_for(1.6)
    assert fleet.decisions()[("to_prefill", "ttft_miss")] == 1.0
    assert list(fleet.roles.values()).count("prefill") == 3
    fleet.slow_decode()
    await fleet.run_for(2.0)
    counted = fleet.decisions()
    assert counted.get(("none", "dwell"), 0) >= 3
    assert ("to_decode", "tpot_miss") not in counted and counted[("to_prefill", "ttft_miss")] == 1.0
    assert len(fleet.obeyed) == 1


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("pd-model"))


def test_real_workers_report_latency_and_obey_the_switch(spawn_pd_controller, tiny_model, tmp_path):
    # a TTFT target no real request can meet, a TPOT target every request meets
    ctrl = spawn_pd_controller(**{"--pd-ttft-slo-ms": "0.001", "--pd-tpot-slo-ms": "100000"})
    workers = {}
    try:
        for worker_id, role in (("p0", "prefill"), ("d0", "decode"), ("d1", "decode")):
            workers[worker_id] = WorkerProcess(tiny_model, tmp_path / f"{worker_id}.log", "--timing", "virtual",
                                               "--worker-id", worker_id, "--role", role, "--controller", ctrl.address)
        stubs = {w: p.wait_ready().stub for w, p in workers.items()}
        for stub in stubs.values():
            req = pb.GenerateRequest(prompt_text="measure me", sampling=pb.SamplingParams(temperature=0, max_tokens=4))
            assert sum(len(c.token_ids) for c in stub.Generate(req, timeout=30)) == 4

        switched = wait_until(lambda: [w for w in ("d0", "d1")
                                       if stubs[w].Status(pb.StatusRequest()).role == Role.PREFILL.to_proto()],
                              timeout=20, interval=0.05, what="a decode worker switched to prefill")
        assert len(switched) == 1
        wait_until(lambda: roles(ctrl)[switched[0]] == "prefill" and ctrl.instances()[switched[0]]["state"] == "ready",
                   timeout=20, interval=0.05, what="the switch in the controller's records")
        record = ctrl.instances()["p0"]
        assert record["ttft_samples"] >= 1 and record["ttft_p90_s"] > 0
        assert decisions(ctrl)[("to_prefill", "ttft_miss")] == 1.0
    finally:
        for process in workers.values():
            process.stop()
