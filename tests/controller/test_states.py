"""The health state machine as pure functions: exact transitions on a record."""

from __future__ import annotations

from mindmotor.vocabulary import InstanceState
from mindmotor.controller import states
from mindmotor.controller.records import InstanceRecord

SUSPECT, DEAD, FORGET = 0.6, 1.5, 5.0


def record(**kwargs) -> InstanceRecord:
    fields = dict(instance_id="w", address="h:1", model="m", registered_at=100.0, state_since=100.0)
    fields.update(kwargs)
    return InstanceRecord(**fields)


def sweep(r: InstanceRecord, now: float, baseline: float = 0.0) -> bool:
    return states.on_sweep(r, now, baseline, SUSPECT, DEAD)


def test_starting_becomes_ready_on_first_heartbeat():
    r = record()
    assert r.state == InstanceState.STARTING and not r.routable
    assert states.on_heartbeat(r, 100.1, "serving")
    assert r.state == InstanceState.READY and r.routable and r.last_heartbeat == 100.1


def test_ready_suspect_dead_by_heartbeat_age():
    r = record()
    states.on_heartbeat(r, 100.0, "serving")
    assert not sweep(r, 100.5)
    assert sweep(r, 100.7) and r.state == InstanceState.SUSPECT and not r.routable
    assert not sweep(r, 101.4)
    assert sweep(r, 101.6) and r.state == InstanceState.DEAD
    assert not sweep(r, 200.0)                       # dead stays dead


def test_suspect_returns_to_ready_on_heartbeat():
    r = record()
    states.on_heartbeat(r, 100.0, "serving")
    sweep(r, 100.7)
    assert states.on_heartbeat(r, 100.8, "serving") and r.state == InstanceState.READY


def test_starting_without_heartbeat_dies():
    r = record()
    assert not sweep(r, 101.0)                       # starting is never suspect
    assert sweep(r, 101.6) and r.state == InstanceState.DEAD


def test_new_leader_grants_a_full_dead_timeout():
    r = record()
    states.on_heartbeat(r, 100.0, "serving")
    assert not sweep(r, 130.0, baseline=129.5)       # 30 s old, but the leader started 0.5 s ago
    assert sweep(r, 130.2, baseline=129.5) and r.state == InstanceState.SUSPECT
    assert sweep(r, 131.1, baseline=129.5) and r.state == InstanceState.DEAD


def test_failure_report_holds_suspect_despite_heartbeats():
    r = record()
    states.on_heartbeat(r, 100.0, "serving")
    assert states.on_failure_report(r, 100.1, "connect refused", hold_s=SUSPECT)
    assert r.state == InstanceState.SUSPECT and r.failures == 1 and "connect refused" in r.reason
    assert not states.on_heartbeat(r, 100.5, "serving") and r.state == InstanceState.SUSPECT
    assert states.on_heartbeat(r, 100.8, "serving") and r.state == InstanceState.READY


def test_draining_reported_and_commanded():
    r = record()
    states.on_heartbeat(r, 100.0, "serving")
    assert states.on_heartbeat(r, 100.2, "draining") and r.state == InstanceState.DRAINING and not r.routable
    assert states.on_heartbeat(r, 100.4, "serving") and r.state == InstanceState.READY   # the worker resumed

    assert states.on_drain_command(r, 100.5, "rollout") and r.drain_commanded
    assert not states.on_heartbeat(r, 100.6, "serving") and r.state == InstanceState.DRAINING  # not seen yet
    assert not states.on_heartbeat(r, 100.8, "draining")
    assert sweep(r, 101.5) and r.state == InstanceState.SUSPECT                # a silent draining instance
    assert states.on_heartbeat(r, 101.6, "draining") and r.state == InstanceState.DRAINING


def test_dead_is_final_and_forgotten():
    r = record(state=InstanceState.DEAD, last_heartbeat=100.0, state_since=101.5)
    assert not states.on_failure_report(r, 102.0, "x", hold_s=SUSPECT)
    assert not states.on_drain_command(r, 102.0, "")
    assert not states.should_forget(r, 105.0, FORGET)
    assert states.should_forget(r, 106.6, FORGET)


def test_record_json_round_trip_ignores_unknown_fields():
    r = record(cached_block_hashes=["00ff"], commands=[{"drain": {"reason": ""}}])
    data = r.to_dict() | {"field_from_a_newer_controller": 1}
    assert InstanceRecord.from_dict(data) == r
    info = r.to_info()
    assert info.cached_block_hashes == [b"\x00\xff"] and info.state == "starting" and not info.routable
