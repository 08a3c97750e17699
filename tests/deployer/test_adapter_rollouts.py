"""A new version of one LoRA adapter rolled out as a canary, with real processes (controller,
deployer, its replicas, a coordinator): only that adapter's requests are split, the base model's
stay with the serving version; promote gives the new version everything and clears the split."""

from __future__ import annotations

import asyncio
import re
from collections import Counter

import grpc
import httpx
import pytest

from mindmotor.common.waiting import wait_until
from mindmotor.model.config import LlamaConfig
from mindmotor.model.testing import write_random_adapter

from .conftest import replica_pids


def controller_entries(cluster) -> dict[str, dict]:
    """adapter ("" : the model's) -> the weights the controller's routing table carries."""
    from mindmotor.controller.client import RoutingTableWatcher

    async def read():
        watcher = RoutingTableWatcher(cluster.controller_address)
        await watcher.start()
        try:
            table = await watcher.wait_for(lambda t: True, timeout=10)
        finally:
            await watcher.stop()
        return {t.adapter: dict(t.weights) for t in table.traffic if t.deployment == cluster.deployment}

    return asyncio.run(read())


def versions_serving(url: str, model: str, count: int) -> Counter:
    """Send `count` completions naming `model`; how many each version served."""
    served = Counter()
    for _ in range(count):
        r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "def f():", "max_tokens": 2,
                                                      "temperature": 0}, timeout=30)
        assert r.status_code == 200, r.text
        served[r.headers["x-mindmotor-version"]] += 1
    return served


@pytest.fixture
def adapters(tiny_ckpt, tmp_path):
    config = LlamaConfig.from_dir(tiny_ckpt)
    return {tag: write_random_adapter(tmp_path / f"sql-{tag}", config, seed=seed) for tag, seed in (("v1", 1), ("v2", 2))}


def test_an_adapter_canary_splits_that_adapter_alone_then_promotes(cluster, adapters, tmp_path):
    cluster.start_controller()
    client = cluster.client(cluster.start_deployer())
    spec = cluster.spec({"name": "v1", "worker": {"timing": "virtual", "enable_lora": True,
                                                  "lora_modules": f"sql={adapters['v1']}"}}, traffic={"v1": 100})
    client.apply(spec)
    cluster.wait_ready("v1", 1)

    with pytest.raises(grpc.RpcError) as refused:                    # not an adapter: nothing changes
        client.rollout(cluster.deployment, "v2", adapter="sql", adapter_path=str(tmp_path), canary=50)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "adapter_config.json" in refused.value.details()

    started = client.rollout(cluster.deployment, "v2", adapter="sql", adapter_path=str(adapters["v2"]), canary=50)
    assert (started.rollout.adapter, started.rollout.adapter_path) == ("sql", str(adapters["v2"]))
    assert dict(started.spec.versions[1].worker)["lora_modules"] == f"sql={adapters['v2']}"
    canary = client.wait_rollout(cluster.deployment, timeout_s=30)
    assert canary.rollout.phase == "canary", canary.rollout.reason
    assert dict(canary.spec.traffic) == {"v1": 100}
    assert dict(canary.spec.adapter_traffic["sql"].weights) == {"v1": 50, "v2": 50}
    wait_until(lambda: controller_entries(cluster) == {"": {"v1": 100}, "sql": {"v1": 50, "v2": 50}},
               what="the adapter's split in the controller")

    coordinator = cluster.start_coordinator()
    url = f"http://127.0.0.1:{coordinator.ready['port']}"

    def both_hold_sql() -> bool:
        listed = httpx.get(f"{url}/v1/models", timeout=5).json()["data"]
        health = httpx.get(f"{url}/health", timeout=5).json()
        return any(m["id"] == "sql" for m in listed) and \
            sum(1 for v in health["instances"].values() if v["routable"]) == 2

    wait_until(both_hold_sql, timeout=30, what="the coordinator to route to both versions")
    wait_until(lambda: versions_serving(url, "sql", 4) == Counter({"v1": 2, "v2": 2}), timeout=15,
               what="the adapter's requests split evenly (once every instance's adapters are polled)")
    assert versions_serving(url, cluster.model, 4) == Counter({"v1": 4})     # the base model: v1 alone
    metrics = httpx.get(f"{url}/metrics", timeout=5).text          # what the canary analysis reads for sql
    assert re.search(r'mindmotor_coordinator_version_requests_total\{model="sql",version="v2"\} [1-9]', metrics)

    promoted = client.promote(cluster.deployment)
    assert [v.name for v in promoted.spec.versions] == ["v2"] and dict(promoted.spec.traffic) == {"v2": 100}
    assert not promoted.spec.adapter_traffic
    wait_until(lambda: controller_entries(cluster) == {"": {"v2": 100}}, what="the adapter's split cleared")
    wait_until(lambda: set(replica_pids(cluster.deployment)) == {f"{cluster.deployment}-v2-0"},
               what="v1's replica to drain and exit")
    wait_until(lambda: versions_serving(url, "sql", 2) == Counter({"v2": 2}), timeout=15, what="v2 to serve sql")
