"""Dynamic P/D roles in the simulator: the controller's ratio policy moves an instance to the side
under pressure and back, the switching instance drains first, and no request or block is lost."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mindmotor.controller.pd_ratio import SLO, RatioPolicyConfig
from mindmotor.simulator import ClusterSpec, TraceRequest, simulate
from mindmotor.simulator.dynamic_roles import DynamicRoles, DynamicRolesConfig

SPLIT = ClusterSpec(mixed=0, prefill=2, decode=2, device="910B3", model="qwen2-7b")
FAST_POLICY = RatioPolicyConfig(headroom=0.7, sustain_s=2.0, dwell_s=5.0)


def phases(seed: int = 0) -> list[TraceRequest]:
    """20 s of long prompts with 20-token answers (prefill pressure: ~1.4x what two prefill cards
    serve), then 20 s of short prompts with long answers (decode pressure on one decode card)."""
    rng = np.random.default_rng(seed)
    out = []
    for start, duration, rate, prompt, output in ((0.0, 20.0, 11.0, 3000, 20), (30.0, 20.0, 40.0, 32, 300)):
        t = start
        while t < start + duration:
            t += rng.exponential(1 / rate)
            out.append(TraceRequest(float(t), prompt, output))
    return out


def test_prefill_pressure_moves_a_decode_instance_and_decode_pressure_moves_it_back():
    trace = phases()
    roles = DynamicRoles(DynamicRolesConfig(SLO(ttft_s=0.5, tpot_s=0.03), FAST_POLICY, interval_s=1.0))
    result = simulate(SPLIT, trace, roles=roles)

    first, second = roles.switches[0], roles.switches[1]
    assert (first.old_role, first.new_role, first.reason) == ("decode", "prefill", "ttft_miss")
    assert first.decided_s < 20.0 and first.drained
    assert (second.old_role, second.new_role, second.reason) == ("prefill", "decode", "tpot_miss")
    assert second.decided_s > 30.0
    assert second.decided_s - first.decided_s >= FAST_POLICY.dwell_s
    # the switched instance served prefills in its new role once it had drained
    assert any(r.prefill_instance == first.instance and r.arrival_s > first.done_s for r in result.requests)
    # nothing lost: every request finished with all its tokens
    assert all(r.finished_s is not None and r.tokens_done == r.output_tokens for r in result.requests)
    assert result.extra["dynamic_roles"]["switches"][0]["new_role"] == "prefill"


class CheckedRoles(DynamicRoles):
    """Checks every instance's block pool against its live sequences at every evaluation."""

    checks = 0

    def evaluate(self, now):
        for inst in self.cluster.instances:
            holders = inst.scheduler.block_holders()     # running, pinned, waiting for KV
            held = {id(seq) for seq in holders}
            assert all(id(r.seq) in held for r in inst.requests.values() if r.seq.block_table)
            inst.block_manager.check_invariants(holders)
        self.checks += 1
        return super().evaluate(now)


def test_switches_lose_no_request_and_keep_every_block_pool_consistent():
    """A small KV pool (preemptions, handoffs that fall back to a local prefill) and a drain
    timeout of zero: instances switch at once, with requests still in flight."""
    trace = phases(seed=1)
    roles = CheckedRoles(DynamicRolesConfig(SLO(ttft_s=0.5, tpot_s=0.03), FAST_POLICY, interval_s=0.5,
                                            drain_timeout_s=0.0))
    result = simulate(SPLIT, trace, num_blocks=600, roles=roles)

    assert roles.checks > 50 and len(roles.switches) >= 2
    assert any(s.drained is False for s in roles.switches)           # switched with work in flight
    assert sum(x.scheduler.num_preemptions for x in result.instances) > 0
    assert all(r.finished_s is not None and r.tokens_done == r.output_tokens for r in result.requests)
    for inst in result.instances:
        inst.block_manager.check_invariants([])
        assert inst.block_manager.num_free_blocks == inst.block_manager.num_blocks
        assert inst.scheduler.kv.num_pinned == 0 and not inst.requests and inst.in_flight == 0


def test_without_pressure_the_ratio_stays():
    rng = np.random.default_rng(2)
    trace = [TraceRequest(float(t), 500, 50) for t in np.cumsum(rng.exponential(1 / 2.0, 120))]
    roles = DynamicRoles(DynamicRolesConfig(SLO(ttft_s=2.0, tpot_s=0.2), FAST_POLICY, interval_s=1.0))
    simulate(SPLIT, trace, roles=roles)
    assert roles.switches == [] and roles.roles() == {"prefill": 2, "decode": 2}


def test_dynamic_roles_need_a_split():
    with pytest.raises(ValueError, match="P/D split"):
        simulate(ClusterSpec(mixed=2), [TraceRequest(0.0, 10, 2)],
                 roles=DynamicRoles(DynamicRolesConfig(SLO(1.0, 0.1))))


def test_simulate_cli_flag_uses_the_controllers_default_hysteresis(tmp_path, capsys):
    """`mindmotor simulate --dynamic-roles`: with the controller's defaults (30 s sustain) a minute
    of prefill pressure moves one decode instance; the JSON carries the switch."""
    from mindmotor.cli import main

    rng = np.random.default_rng(4)
    rows = [(round(float(t), 4), 3000, 20) for t in np.cumsum(rng.exponential(1 / 11.0, 660))]
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "\n".join(",".join(map(str, r)) for r in rows))
    argv = ["simulate", "--trace", str(trace), "--prefill", "2", "--decode", "2", "--slo-ttft", "0.5",
            "--slo-tpot", "0.1", "--dynamic-roles"]
    assert main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (switch,) = out["dynamic_roles"]["switches"]
    assert (switch["old_role"], switch["new_role"]) == ("decode", "prefill")
    assert switch["decided_s"] >= RatioPolicyConfig().sustain_s
    assert out["dynamic_roles"]["final_roles"] == {"prefill": 3, "decode": 1} and out["requests"] == 660
    assert main(argv[:-1] + ["--instances", "0"]) == 0 and "dynamic roles" not in capsys.readouterr().out
    assert main(["simulate", "--trace", str(trace), "--instances", "2", "--dynamic-roles"]) == 2


def test_windows_are_filled_like_a_workers_request_timer():
    """TTFT on the instance that made the first token; the decode instance's TPOT timed from the
    first token it made itself, so the KV handoff (here over the slower inter-node link) is not in it."""
    spec = ClusterSpec(mixed=0, prefill=1, decode=1, device="910B3", model="qwen2-7b", cards_per_node=1)
    roles = DynamicRoles(DynamicRolesConfig(SLO(1.0, 0.1)))
    result = simulate(spec, [TraceRequest(0.0, 1000, 5)], roles=roles)
    (req,) = result.requests
    assert roles.ttft[0].values() == [req.first_token_s] and roles.tpot[0].values() == []
    (tpot,) = roles.tpot[1].values()
    end_to_end = (req.finished_s - req.first_token_s) / 4
    first_gap = req.finished_s - req.first_token_s - 3 * tpot      # first token -> the decode side's first
    assert tpot < end_to_end and first_gap >= result.kv_transfer_s > 0
