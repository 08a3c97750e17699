"""An InferenceService's `status`: Kubernetes-style conditions and the merge patch that writes it.

    conditions = set_condition(old_conditions, ServiceCondition.READY, True, ServiceReason.ALL_REPLICAS_READY,
                               "4 of 4 replicas of v1 ready", generation, now)
    patch = status_patch(old_status, new_status)   # for a JSON merge patch of .status

A condition keeps its `lastTransitionTime` while its status stays the same (reason and message
may change). The status is written with a JSON merge patch, which merges mappings key by key: a
key the new status no longer has (a version gone from `traffic`, the `canary` of a rolled-back
rollout) is set to null in the patch so that it goes.
"""

from __future__ import annotations

import datetime
from typing import Any

from mindmotor.vocabulary import ServiceCondition, ServiceReason

CONDITION_ORDER = [ServiceCondition.READY, ServiceCondition.PROGRESSING, ServiceCondition.CANARY,
                   ServiceCondition.TRAFFIC_ROUTED]


def timestamp(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: list[dict[str, Any]], kind: ServiceCondition, status: bool, reason: ServiceReason,
                  message: str, generation: int, now: float) -> list[dict[str, Any]]:
    """The conditions with `kind` set (a new list; the others kept, in CONDITION_ORDER)."""
    text = "True" if status else "False"
    old = next((c for c in conditions if c.get("type") == kind), None)
    since = old["lastTransitionTime"] if old and old.get("status") == text and old.get("lastTransitionTime") \
        else timestamp(now)
    new = {"type": str(kind), "status": text, "reason": str(reason), "message": message,
           "observedGeneration": generation, "lastTransitionTime": since}
    others = {c.get("type"): c for c in conditions if c.get("type") != kind}
    others[str(kind)] = new
    order = [str(k) for k in CONDITION_ORDER]
    return sorted(others.values(), key=lambda c: order.index(c["type"]) if c["type"] in order else len(order))


def condition(status: dict[str, Any] | None, kind: ServiceCondition) -> dict[str, Any] | None:
    return next((c for c in (status or {}).get("conditions") or [] if c.get("type") == kind), None)


def status_patch(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch taking `old` to `new` for the keys `new` names (mappings key by key,
    missing keys nulled; lists and scalars replaced)."""
    return _merge(old or {}, new)


def _merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            patch[key] = {**{k: None for k in before if k not in value}, **_merge(before, value)}
        else:
            patch[key] = value
    return patch
