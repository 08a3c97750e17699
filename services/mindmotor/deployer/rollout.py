"""A rollout's steps, as changes to a `DeploymentRecord` (pure: no I/O; the caller stores them).

    begin     the new version joins the spec with no traffic; phase "starting", with a deadline
    ready     (the reconcile loop, once every new replica is ready in the controller) the new
              version takes `canary` percent of the deployment's traffic from the previous one;
              phase "canary"
    promote   the new version takes the previous one's whole share; the previous version leaves
              the spec (its replicas drain); phase "promoted"
    roll_back the new version's share goes back to the previous one and the new version leaves the
              spec; phase "rolled_back" (the operator) or "failed" (the deadline passed, or the
              canary analysis found it worse than the previous version: analysis.py)

Traffic moves by weights, not by rewriting every version's weight: other versions of the
deployment (an A/B split) keep theirs throughout.
"""

from __future__ import annotations

from mindmotor.vocabulary import RolloutPhase

from .records import DeploymentRecord, RolloutState
from .spec import DeploymentSpec, VersionSpec

WEIGHT_DIGITS = 6


def canary_share(traffic: dict[str, float], canary: float) -> float:
    """The weight that is `canary` percent of the deployment's traffic."""
    return round(sum(traffic.values()) * canary / 100.0, WEIGHT_DIGITS)


def begin(record: DeploymentRecord, new: VersionSpec, previous: str, canary: float, now: float,
          timeout_s: float, analysis: dict | None = None, tokenizer_change: bool = False) -> None:
    spec = record.spec.to_dict()
    spec["versions"].append(new.model_dump(mode="json"))
    _set_spec(record, spec, now)
    record.rollout = RolloutState(
        version=new.name, previous=previous, canary=canary, phase=RolloutPhase.STARTING, started_at=now, updated_at=now,
        deadline=now + timeout_s, analysis=analysis, tokenizer_change=tokenizer_change,
        reason=f"waiting for {new.replicas} replica(s) of {new.name} to be ready (at most {timeout_s:g} s)")


def ready(record: DeploymentRecord, now: float) -> None:
    rollout = _rollout(record)
    traffic = dict(record.spec.traffic)
    share = min(canary_share(traffic, rollout.canary), traffic.get(rollout.previous, 0.0))
    traffic[rollout.previous] = round(traffic.get(rollout.previous, 0.0) - share, WEIGHT_DIGITS)
    traffic[rollout.version] = round(traffic.get(rollout.version, 0.0) + share, WEIGHT_DIGITS)
    _set_spec(record, {**record.spec.to_dict(), "traffic": traffic}, now)
    rollout.canary_at = now
    _phase(record, RolloutPhase.CANARY, f"{rollout.version} is ready and takes {rollout.canary:g}% of the traffic", now)


def promote(record: DeploymentRecord, now: float) -> None:
    rollout = _rollout(record)
    traffic = dict(record.spec.traffic)
    traffic[rollout.version] = traffic.get(rollout.version, 0.0) + traffic.pop(rollout.previous, 0.0)
    spec = record.spec.to_dict()
    spec["versions"] = [v for v in spec["versions"] if v["name"] != rollout.previous]
    _set_spec(record, {**spec, "traffic": traffic}, now)
    _phase(record, RolloutPhase.PROMOTED, f"{rollout.version} takes all of {rollout.previous}'s traffic; "
                             f"{rollout.previous} is drained and removed", now)


def roll_back(record: DeploymentRecord, reason: str, now: float, failed: bool = False) -> None:
    rollout = _rollout(record)
    traffic = dict(record.spec.traffic)
    traffic[rollout.previous] = traffic.get(rollout.previous, 0.0) + traffic.pop(rollout.version, 0.0)
    spec = record.spec.to_dict()
    spec["versions"] = [v for v in spec["versions"] if v["name"] != rollout.version]
    _set_spec(record, {**spec, "traffic": traffic}, now)
    _phase(record, RolloutPhase.FAILED if failed else RolloutPhase.ROLLED_BACK, reason, now)


def _rollout(record: DeploymentRecord) -> RolloutState:
    if record.rollout is None:
        raise ValueError(f"deployment {record.name} has no rollout")
    return record.rollout


def _set_spec(record: DeploymentRecord, spec: dict, now: float) -> None:
    record.spec = DeploymentSpec.model_validate(spec)
    record.generation += 1
    record.updated_at = now


def _phase(record: DeploymentRecord, phase: str, reason: str, now: float) -> None:
    rollout = _rollout(record)
    rollout.phase, rollout.reason, rollout.updated_at = phase, reason, now
