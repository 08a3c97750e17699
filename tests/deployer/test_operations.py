"""What each Deployer call does to the stored desired state (in-process, memory store): refusals
that change nothing, and a rollout's steps with their traffic arithmetic."""

from __future__ import annotations

import pytest

from mindmotor.common.store import MemoryStore
from mindmotor.deployer import rollout
from mindmotor.deployer.operations import Deployments, FailedPrecondition, InvalidArgument, NotFound
from mindmotor.deployer.records import DeploymentRecord
from mindmotor.deployer.spec import parse_spec
from mindmotor.deployer.store import DeploymentStore

class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def ops(tiny_ckpt):
    pokes = []
    deployments = Deployments(DeploymentStore(MemoryStore()), on_change=lambda: pokes.append(1),
                              rollout_timeout_s=60, clock=Clock())
    deployments.pokes = pokes
    deployments.ckpt = str(tiny_ckpt)
    return deployments


def spec(ops, *versions, name="demo", model="m", traffic=None):
    data = {"name": name, "model": model,
            "versions": [{"checkpoint": ops.ckpt, **v} for v in versions or [{"name": "v1", "replicas": 2}]]}
    if traffic:
        data["traffic"] = traffic
    return parse_spec(data)


@pytest.mark.asyncio
async def test_apply_creates_then_updates_only_what_may_change(ops):
    first = await ops.apply(spec(ops))
    assert (first.generation, first.spec.versions[0].checkpoint, ops.pokes) == (1, ops.ckpt, [1])
    assert (await ops.apply(spec(ops))).generation == 1                        # nothing changed
    scaled = await ops.apply(spec(ops, {"name": "v1", "replicas": 5}, {"name": "v2", "replicas": 1},
                                  traffic={"v1": 9, "v2": 1}))
    assert scaled.generation == 2 and scaled.targets() == {"v1": 5, "v2": 1}

    with pytest.raises(FailedPrecondition, match="version 'v1' exists with other worker"):
        await ops.apply(spec(ops, {"name": "v1", "replicas": 5, "worker": {"timing": "virtual"}}))
    with pytest.raises(FailedPrecondition, match="the served model name cannot change"):
        await ops.apply(spec(ops, model="other"))
    with pytest.raises(FailedPrecondition, match="deployment 'demo' already serves the model 'm'"):
        await ops.apply(spec(ops, name="second"))
    assert (await ops.get("demo")).generation == 2


@pytest.mark.asyncio
async def test_delete_and_set_traffic(ops):
    await ops.apply(spec(ops, {"name": "v1"}, {"name": "v2"}))
    assert (await ops.set_traffic("demo", {"v1": 0, "v2": 5})).spec.traffic == {"v1": 0, "v2": 5}
    with pytest.raises(InvalidArgument, match="weights: weights must sum to more than 0"):
        await ops.set_traffic("demo", {"v1": 0})
    with pytest.raises(NotFound):
        await ops.set_traffic("nope", {"v1": 1})

    deleting = await ops.delete("demo")
    assert deleting.deleting and deleting.targets() == {} and deleting.desired_traffic() == {}
    with pytest.raises(FailedPrecondition, match="is being deleted"):
        await ops.apply(spec(ops))
    assert (await ops.delete("demo")).generation == deleting.generation             # idempotent


@pytest.mark.asyncio
async def test_rollout_refusals_change_nothing(ops, tampered_ckpt):
    await ops.apply(spec(ops, {"name": "v1", "replicas": 2}, {"name": "b", "replicas": 1}, traffic={"v1": 1, "b": 3}))
    before = (await ops.get("demo")).to_dict()
    refusals = [
        (dict(version="v2", checkpoint=str(tampered_ckpt), canary=10, previous="v1"), InvalidArgument,
         "checkpoint: .*tokenizer_config.json: sha256"),
        (dict(version="v2", checkpoint="", canary=10), InvalidArgument, "previous: the deployment has versions v1, b"),
        (dict(version="v2", checkpoint="", canary=0, previous="v1"), InvalidArgument, "canary: a percent"),
        (dict(version="b", checkpoint="", canary=10, previous="v1"), FailedPrecondition, "already exists"),
        (dict(version="v2", checkpoint="", canary=50, previous="v1", allow_tokenizer_change=True), FailedPrecondition,
         "a canary of 50% is more traffic than v1 has"),
        (dict(version="v2", checkpoint="", canary=10, previous="v1"), FailedPrecondition,
         "v2's checkpoint has another tokenizer than v1"),
    ]
    for kwargs, error, message in refusals:
        with pytest.raises(error, match=message):
            await ops.rollout("demo", **kwargs)
    assert (await ops.get("demo")).to_dict() == before


@pytest.mark.asyncio
async def test_a_rollout_step_by_step(ops):
    await ops.apply(spec(ops, {"name": "v1", "replicas": 2, "prefill": 1, "worker": {"device": "910B4"}},
                         traffic={"v1": 100}))
    started = await ops.rollout("demo", "v2", ops.ckpt, canary=10)
    new = started.spec.version("v2")
    assert (new.replicas, new.prefill, new.worker, new.checkpoint) == (2, 1, {"device": "910B4"}, ops.ckpt)
    assert (started.rollout.phase, started.rollout.deadline, started.spec.traffic) == ("starting", 1060.0, {"v1": 100})
    with pytest.raises(FailedPrecondition, match="no rollout in the canary phase"):
        await ops.promote("demo")
    with pytest.raises(FailedPrecondition, match="the rollout of 'v2' is in progress"):
        await ops.apply(spec(ops, {"name": "v1", "replicas": 2, "prefill": 1, "worker": {"device": "910B4"}}))

    record = await ops.get("demo")
    rollout.ready(record, now=1010.0)                      # what the reconcile loop does once v2 is ready
    assert (record.rollout.phase, record.spec.traffic) == ("canary", {"v1": 90, "v2": 10})
    await ops.store.update("demo", lambda r: rollout.ready(r, now=1010.0))

    promoted = await ops.promote("demo")
    assert promoted.rollout.phase == "promoted"
    assert (promoted.spec.version_names(), promoted.spec.traffic) == (["v2"], {"v2": 100})
    with pytest.raises(FailedPrecondition, match="after a promote, roll out the previous checkpoint"):
        await ops.roll_back("demo")


def test_traffic_moves_only_between_the_two_versions():
    record = DeploymentRecord(spec=parse_spec({"name": "demo", "model": "m", "traffic": {"a": 50, "b": 50},
                                               "versions": [{"name": "a"}, {"name": "b"}]}))
    rollout.begin(record, record.spec.versions[0].model_copy(update={"name": "c"}), "a", canary=20, now=0,
                  timeout_s=10)
    rollout.ready(record, now=1)
    assert record.spec.traffic == {"a": 30, "b": 50, "c": 20}            # 20% of 100 taken from a only
    rolled_back = DeploymentRecord.from_dict(record.to_dict())
    rollout.roll_back(rolled_back, "operator", now=2)
    assert (rolled_back.spec.traffic, rolled_back.rollout.phase) == ({"a": 50, "b": 50}, "rolled_back")
    rollout.promote(record, now=2)
    assert record.spec.traffic == {"b": 50, "c": 50} and record.spec.version_names() == ["b", "c"]
    assert DeploymentRecord.from_dict(record.to_dict()) == record            # what the store keeps
