"""The status the operator writes: conditions keep their transition time while their status holds,
and the merge patch removes what the new status no longer has (a JSON merge patch alone would keep
a rolled-back canary's weight in `traffic` forever)."""

from __future__ import annotations

from fake_kube_server import merge_patch

from mindmotor.operator.status import set_condition, status_patch
from mindmotor.vocabulary import ServiceCondition, ServiceReason


def test_a_condition_keeps_its_transition_time_until_its_status_changes():
    ready = set_condition([], ServiceCondition.READY, False, ServiceReason.REPLICAS_NOT_READY, "0 of 2", 1, 1000.0)
    again = set_condition(ready, ServiceCondition.READY, False, ServiceReason.REPLICAS_NOT_READY, "1 of 2", 1, 2000.0)
    assert again[0]["lastTransitionTime"] == ready[0]["lastTransitionTime"] == "1970-01-01T00:16:40Z"
    assert again[0]["message"] == "1 of 2"
    flipped = set_condition(again, ServiceCondition.READY, True, ServiceReason.ALL_REPLICAS_READY, "2 of 2", 2, 3000.0)
    assert (flipped[0]["status"], flipped[0]["lastTransitionTime"], flipped[0]["observedGeneration"]) == \
        ("True", "1970-01-01T00:50:00Z", 2)
    both = set_condition(flipped, ServiceCondition.CANARY, False, ServiceReason.NO_CANARY, "no canary", 2, 3000.0)
    assert [c["type"] for c in set_condition(both, ServiceCondition.READY, True, ServiceReason.ALL_REPLICAS_READY,
                                             "2 of 2", 2, 4000.0)] == ["Ready", "Canary"]


def test_the_status_patch_removes_what_the_new_status_no_longer_has():
    old = {"traffic": {"v1": 90.0, "v2": 10.0}, "canary": {"version": "v2", "phase": "CanaryServing"},
           "versions": [{"name": "v1"}, {"name": "v2"}], "kopf": {"kept": True}}
    new = {"traffic": {"v1": 100.0}, "canary": None, "versions": [{"name": "v1"}]}
    patched = merge_patch(old, status_patch(old, new))
    assert patched == {"traffic": {"v1": 100.0}, "versions": [{"name": "v1"}], "kopf": {"kept": True}}
