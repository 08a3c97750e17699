"""The health state machine of one instance.

    Register ──▶ starting ──first heartbeat──▶ ready ◀──────────────┐
                    │                           │                  │ heartbeat (after the
                    │ no heartbeat for          │ no heartbeat for │ failure-report hold)
                    │ dead_after                │ suspect_after    │
                    │                           ▼                  │
                    │           ReportFailure ▶ suspect ───────────┘
                    │                           │ no heartbeat for dead_after
                    ▼                           ▼
                   dead ◀───────────────────────┘   (leaves the routing table; the record is
                                                     forgotten after forget_after; a heartbeat
                                                     from it is answered with "re-register")
    draining: entered when the worker reports "draining" or a drain is commanded (from any live
    state); left for ready only when the worker reports "serving" again and no drain was
    commanded; misses heartbeats like ready does (→ suspect → dead).

- suspect_after = heartbeat interval × k (default 1 s × 3); dead_after default 5 s (MindIE
  Controller's heartbeat timeout). Ages are measured from the last heartbeat, the registration,
  or the moment this controller became leader, whichever is latest: a restarted or newly elected
  controller gives every instance a full dead_after to heartbeat again before declaring it dead.
- A failure report holds the instance in suspect for at least suspect_after even if its
  heartbeats continue (the coordinator could not reach it, the controller can).
- Only `ready` is routable; `starting`, `suspect` and `draining` are listed in the routing table
  but not routed to; `dead` is not listed.

The states are `InstanceState`, the reported ones `WorkerState` (vocabulary.py). The
functions here are pure: they change a record and return whether its state changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mindmotor.vocabulary import InstanceState, WorkerState

if TYPE_CHECKING:
    from .records import InstanceRecord


def transition(record: "InstanceRecord", state: InstanceState, now: float, reason: str) -> bool:
    if record.state == state:
        return False
    record.state = state
    record.state_since = now
    record.reason = reason
    return True


def on_heartbeat(record: "InstanceRecord", now: float, reported_state: str) -> bool:
    """A heartbeat arrived (the caller has checked the record is not dead)."""
    record.last_heartbeat = now
    record.reported_state = reported_state
    if reported_state == WorkerState.DRAINING:
        return transition(record, InstanceState.DRAINING, now, "reported by the worker")
    if record.state == InstanceState.SUSPECT and now < record.suspect_until:
        return False                                   # held by a failure report
    if record.state == InstanceState.DRAINING and record.drain_commanded:
        return False                                   # the worker has not seen the command yet
    return transition(record, InstanceState.READY, now, "heartbeat")


def on_sweep(record: "InstanceRecord", now: float, baseline: float, suspect_after_s: float,
             dead_after_s: float) -> bool:
    """The leader's periodic check. `baseline`: when this controller became leader."""
    if record.state == InstanceState.DEAD:
        return False
    age = now - max(record.last_heartbeat, record.registered_at, baseline)
    if age > dead_after_s:
        return transition(record, InstanceState.DEAD, now, f"no heartbeat for {age:.1f} s")
    if age > suspect_after_s and record.state in (InstanceState.READY, InstanceState.DRAINING):
        return transition(record, InstanceState.SUSPECT, now, f"no heartbeat for {age:.1f} s")
    return False


def should_forget(record: "InstanceRecord", now: float, forget_after_s: float) -> bool:
    return record.state == InstanceState.DEAD and now - max(record.last_heartbeat, record.state_since) > forget_after_s


def on_failure_report(record: "InstanceRecord", now: float, reason: str, hold_s: float) -> bool:
    """A coordinator could not reach the instance."""
    if record.state == InstanceState.DEAD:
        return False
    record.suspect_until = max(record.suspect_until, now + hold_s)
    record.failures += 1
    return transition(record, InstanceState.SUSPECT, now,
                      f"failure reported: {reason}" if reason else "failure reported")


def on_drain_command(record: "InstanceRecord", now: float, reason: str) -> bool:
    if record.state == InstanceState.DEAD:
        return False
    record.drain_commanded = True
    return transition(record, InstanceState.DRAINING, now,
                      f"drain commanded: {reason}" if reason else "drain commanded")
