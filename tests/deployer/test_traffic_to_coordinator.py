"""SetTraffic on the deployer reaches a coordinator through the controller's routing table, and
the coordinator splits a model's requests between the versions exactly as the weights say (which
instance served each request is read from the coordinator's `routed_total` counter)."""

from __future__ import annotations

import re

import httpx

from secrets_registry import given_secret
from mindmotor.common.waiting import wait_until

REQUESTS = 8

CONTROLLER_TOKEN = given_secret("traffic-ctl-token")
DEPLOYER_TOKEN = given_secret("traffic-dep-token")


def routed(url: str, model: str) -> dict[str, float]:
    """instance id -> worker requests the coordinator sent it."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    counts = {}
    for m in re.finditer(r"^mindmotor_coordinator_routed_total\{([^}]*)\} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels["model"] == model:
            counts[labels["instance_id"]] = float(m.group(2))
    return counts


def send(url: str, model: str, count: int) -> dict[str, float]:
    """Send `count` completions; how many went to each instance."""
    before = routed(url, model)
    for _ in range(count):
        r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "def f():", "max_tokens": 2,
                                                      "temperature": 0}, timeout=30)
        assert r.status_code == 200, r.text
    after = routed(url, model)
    return {i: n - before.get(i, 0) for i, n in after.items() if n - before.get(i, 0)}


def test_traffic_weights_flow_from_the_deployer_to_the_coordinator(cluster):
    cluster.start_controller(admin_token=CONTROLLER_TOKEN)
    deployer = cluster.start_deployer("--admin-token", DEPLOYER_TOKEN, "--controller-token", CONTROLLER_TOKEN)
    client = cluster.client(deployer, admin_token=DEPLOYER_TOKEN)
    coordinator = cluster.start_coordinator()
    url = f"http://127.0.0.1:{coordinator.ready['port']}"
    v1, v2 = f"{cluster.deployment}-v1-0", f"{cluster.deployment}-v2-0"

    def coordinator_sees(weights: dict) -> bool:
        health = httpx.get(f"{url}/health", timeout=5).json()
        routable = {i for i, v in health["instances"].items() if v["routable"]}
        return health["traffic"].get(cluster.model) == weights and {v1, v2} <= routable

    client.apply(cluster.spec({"name": "v1"}, {"name": "v2"}, traffic={"v1": 100, "v2": 0}))
    wait_until(lambda: coordinator_sees({"v1": 100, "v2": 0}), timeout=30, what="the coordinator to route to v1 only")
    assert send(url, cluster.model, REQUESTS) == {v1: REQUESTS}

    client.set_traffic(cluster.deployment, {"v1": 0, "v2": 100})
    wait_until(lambda: coordinator_sees({"v1": 0, "v2": 100}), what="the new weights to reach the coordinator")
    assert send(url, cluster.model, REQUESTS) == {v2: REQUESTS}

    client.set_traffic(cluster.deployment, {"v1": 1, "v2": 1})
    wait_until(lambda: coordinator_sees({"v1": 1, "v2": 1}), what="an even split to reach the coordinator")
    assert send(url, cluster.model, REQUESTS) == {v1: REQUESTS / 2, v2: REQUESTS / 2}
