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

A LoRA adapter rollout (`adapter`: a new version whose workers serve that adapter from a new
directory) moves the adapter's own split (`spec.adapter_traffic[adapter]`, made from the model's
weights when it has none) instead of the model's: at `ready` the new version takes `canary` percent
of that adapter's requests and nothing else. `promote` gives the new version the previous one's
share everywhere (the model's weights and every adapter's split) and drops the adapter's split if
the rollout made it; `roll_back` restores the split as it was before the rollout.
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
          timeout_s: float, analysis: dict | None = None, tokenizer_change: bool = False, adapter: str = "",
          adapter_path: str = "") -> None:
    spec = record.spec.to_dict()
    spec["versions"].append(new.model_dump(mode="json"))
    _set_spec(record, spec, now)
    before = record.spec.adapter_traffic.get(adapter) if adapter else None
    record.rollout = RolloutState(
        version=new.name, previous=previous, canary=canary, phase=RolloutPhase.STARTING, started_at=now, updated_at=now,
        deadline=now + timeout_s, analysis=analysis, tokenizer_change=tokenizer_change, adapter=adapter,
        adapter_path=adapter_path, adapter_before=dict(before) if before is not None else None,
        reason=f"waiting for {new.replicas} replica(s) of {new.name} to be ready (at most {timeout_s:g} s)")


def ready(record: DeploymentRecord, now: float) -> None:
    rollout = _rollout(record)
    if rollout.adapter:
        traffic = dict(record.spec.adapter_traffic.get(rollout.adapter) or record.spec.traffic)
    else:
        traffic = dict(record.spec.traffic)
    share = min(canary_share(traffic, rollout.canary), traffic.get(rollout.previous, 0.0))
    traffic[rollout.previous] = round(traffic.get(rollout.previous, 0.0) - share, WEIGHT_DIGITS)
    traffic[rollout.version] = round(traffic.get(rollout.version, 0.0) + share, WEIGHT_DIGITS)
    spec = record.spec.to_dict()
    if rollout.adapter:
        spec["adapter_traffic"] = {**spec["adapter_traffic"], rollout.adapter: traffic}
        what = f"of the requests for the adapter {rollout.adapter}"
    else:
        spec["traffic"] = traffic
        what = "of the traffic"
    _set_spec(record, spec, now)
    rollout.canary_at = now
    _phase(record, RolloutPhase.CANARY, f"{rollout.version} is ready and takes {rollout.canary:g}% {what}", now)


def promote(record: DeploymentRecord, now: float) -> None:
    rollout = _rollout(record)
    traffic = dict(record.spec.traffic)
    traffic[rollout.version] = traffic.get(rollout.version, 0.0) + traffic.pop(rollout.previous, 0.0)
    spec = record.spec.to_dict()
    spec["versions"] = [v for v in spec["versions"] if v["name"] != rollout.previous]
    adapters = {name: _moved(weights, rollout.previous, rollout.version)
                for name, weights in spec["adapter_traffic"].items()}
    if rollout.adapter and rollout.adapter_before is None:
        adapters.pop(rollout.adapter, None)                # the rollout made it: the model's split again
    _set_spec(record, {**spec, "traffic": traffic, "adapter_traffic": adapters}, now)
    _phase(record, RolloutPhase.PROMOTED, f"{rollout.version} takes all of {rollout.previous}'s traffic; "
                             f"{rollout.previous} is drained and removed", now)


def roll_back(record: DeploymentRecord, reason: str, now: float, failed: bool = False) -> None:
    rollout = _rollout(record)
    traffic = dict(record.spec.traffic)
    traffic[rollout.previous] = traffic.get(rollout.previous, 0.0) + traffic.pop(rollout.version, 0.0)
    spec = record.spec.to_dict()
    spec["versions"] = [v for v in spec["versions"] if v["name"] != rollout.version]
    adapters = {name: _moved(weights, rollout.version, rollout.previous)
                for name, weights in spec["adapter_traffic"].items()}
    if rollout.adapter:
        adapters.pop(rollout.adapter, None)
        if rollout.adapter_before is not None:
            adapters[rollout.adapter] = dict(rollout.adapter_before)
    _set_spec(record, {**spec, "traffic": traffic, "adapter_traffic": adapters}, now)
    _phase(record, RolloutPhase.FAILED if failed else RolloutPhase.ROLLED_BACK, reason, now)


def _moved(weights: dict[str, float], source: str, target: str) -> dict[str, float]:
    """`weights` with `source`'s weight added to `target`'s (and `source` gone)."""
    if source not in weights:
        return dict(weights)
    moved = dict(weights)
    moved[target] = moved.get(target, 0.0) + moved.pop(source)
    return moved


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
