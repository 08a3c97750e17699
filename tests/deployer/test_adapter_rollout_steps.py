"""The steps of a LoRA adapter rollout on a record (pure: deployer/rollout.py): the canary moves the
adapter's own split only; promote gives the new version everything and drops the split it made;
roll_back restores the split as it was (none, or an A/B set by hand)."""

from __future__ import annotations

import pytest

from mindmotor.deployer import rollout
from mindmotor.deployer.operations import with_adapter
from mindmotor.deployer.records import DeploymentRecord
from mindmotor.deployer.spec import SpecError, parse_spec

WORKER = {"enable_lora": True, "lora_modules": "sql=/a/sql-1 poet=/a/poet-1"}


def record(**fields) -> DeploymentRecord:
    spec = parse_spec({"name": "demo", "model": "m", "versions": [{"name": "v1", "worker": WORKER}],
                       "traffic": {"v1": 100}, **fields})
    return DeploymentRecord(spec=spec)


def begin(r: DeploymentRecord, canary: float = 10) -> None:
    new = with_adapter(r.spec.versions[0].model_copy(update={"name": "v2"}), "sql", "/a/sql-2")
    rollout.begin(r, new, "v1", canary, now=1.0, timeout_s=60, adapter="sql", adapter_path="/a/sql-2")


def test_the_new_version_serves_the_new_directory_and_the_others_unchanged():
    new = with_adapter(record().spec.versions[0], "sql", "/a/sql-2")
    assert new.worker["lora_modules"] == "poet=/a/poet-1 sql=/a/sql-2"
    assert with_adapter(new, "chat", "/a/chat-1").worker["lora_modules"] == "poet=/a/poet-1 sql=/a/sql-2 chat=/a/chat-1"


def test_canary_then_promote():
    r = record()
    begin(r)
    assert r.spec.traffic == {"v1": 100} and not r.spec.adapter_traffic      # nothing before it is ready
    rollout.ready(r, now=2.0)
    assert r.spec.traffic == {"v1": 100}                                      # the base and poet stay on v1
    assert r.spec.adapter_traffic == {"sql": {"v1": 90, "v2": 10}}
    assert "adapter sql" in r.rollout.reason
    rollout.promote(r, now=3.0)
    assert r.spec.version_names() == ["v2"] and r.spec.traffic == {"v2": 100} and not r.spec.adapter_traffic


def test_roll_back_restores_the_split_as_it_was():
    r = record()
    begin(r)
    rollout.ready(r, now=2.0)
    rollout.roll_back(r, "worse", now=3.0)
    assert r.spec.version_names() == ["v1"] and r.spec.traffic == {"v1": 100} and not r.spec.adapter_traffic

    spec = parse_spec({"name": "demo", "model": "m", "traffic": {"v1": 1, "v0": 1},
                       "versions": [{"name": "v0", "worker": WORKER}, {"name": "v1", "worker": WORKER}],
                       "adapter_traffic": {"sql": {"v1": 3, "v0": 1}}})
    r = DeploymentRecord(spec=spec)
    begin(r, canary=50)
    rollout.ready(r, now=2.0)                                  # half of sql's traffic, from v1's share
    assert r.spec.adapter_traffic["sql"] == {"v1": 1, "v0": 1, "v2": 2}
    rollout.roll_back(r, "worse", now=3.0)
    assert r.spec.adapter_traffic == {"sql": {"v1": 3, "v0": 1}}


def test_an_adapter_split_must_name_known_versions():
    with pytest.raises(SpecError, match="adapter_traffic"):
        record(adapter_traffic={"sql": {"v9": 1}})
    with pytest.raises(SpecError, match="not a LoRA adapter name"):
        record(adapter_traffic={"s ql": {"v1": 1}})
