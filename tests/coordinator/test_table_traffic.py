"""Traffic weights from the controller's routing table (set by the Deployer): the controller
source hands them to the router, where they override the static `traffic` setting for the models
they name, and a change of weights starts a fresh split."""

from __future__ import annotations

import asyncio

from mindmotor.coordinator.routing.controller_source import ControllerSource, traffic_from_table
from mindmotor.coordinator.routing.table import InstanceView, RoutingTable
from mindmotor.coordinator.routing.router import Router
from mindmotor.coordinator.routing.policies import RoundRobin, RouteRequest
from mindmotor.protocol import controller_pb2 as cpb


def split(deployment: str, model: str, **weights) -> cpb.TrafficSplit:
    return cpb.TrafficSplit(deployment=deployment, model=model, weights=weights)


def table_with(*versions: str, model: str = "m") -> RoutingTable:
    table = RoutingTable()
    for version in versions:
        table.upsert(InstanceView(instance_id=f"{model}-{version}", address="x:1", model=model, version=version))
    return table


def picks(router: Router, model: str, n: int) -> list[str]:
    return [router.pick(model, RouteRequest([1], 1)).version for _ in range(n)]


def test_table_weights_override_the_static_ones_for_their_models():
    table = table_with("v1", "v2")
    for version in ("v1", "v2"):
        table.upsert(InstanceView(instance_id=f"o-{version}", address="x:1", model="other", version=version))
    router = Router(table, lambda model: RoundRobin(), traffic={"m": {"v1": 1}, "other": {"v2": 1}})
    assert set(picks(router, "m", 4)) == {"v1"}

    router.set_table_traffic({"m": {"v1": 1, "v2": 3}})
    assert picks(router, "m", 8) == ["v2", "v1", "v2", "v2"] * 2
    assert set(picks(router, "other", 4)) == {"v2"}                    # not named by the table: static
    router.set_table_traffic({"m": {"v1": 0, "v2": 1}})
    assert set(picks(router, "m", 4)) == {"v2"}
    router.set_table_traffic({})                                       # the deployment is gone: static again
    assert set(picks(router, "m", 4)) == {"v1"} and router.traffic("m") == {"v1": 1}


def test_traffic_from_a_routing_table():
    table = cpb.RoutingTable(traffic=[split("a", "m1", v1=9, v2=1), split("b", "m2", v1=1),
                                      split("c", "m2", v2=2)])
    assert traffic_from_table(table) == {"m1": {"v1": 9, "v2": 1}, "m2": {"v1": 1, "v2": 2}}


class FakeWatcher:
    def __init__(self, addresses, on_update):
        self.on_update = on_update

    async def start(self):
        self.on_update(cpb.RoutingTable(version=1, traffic=[split("dep", "m", v1=1, v2=1)]))

    async def wait_for(self, predicate, timeout):
        return None

    async def stop(self):
        pass


def test_the_controller_source_hands_the_weights_to_the_router():
    received = []

    async def run():
        source = ControllerSource(["ctrl:1"], RoutingTable(), reporter="c", make_watcher=FakeWatcher,
                                  on_traffic=received.append)
        await source.start()
        source.watcher.on_update(cpb.RoutingTable(version=2))
        await source.stop()

    asyncio.run(run())
    assert received == [{"m": {"v1": 1, "v2": 1}}, {}]


class Adapters:
    """What `AdapterDirectory` tells the router: every instance holds "sql", only v1's in a slot."""

    def holders(self, name):
        return {"m-v1", "m-v2"} if name == "sql" else set()

    def resident(self, name):
        return {"m-v1"}


def test_an_adapters_own_split_applies_to_its_requests_alone():
    router = Router(table_with("v1", "v2"), lambda model: RoundRobin())
    router.adapter_affinity.directory = Adapters()
    router.set_table_traffic(traffic_from_table(cpb.RoutingTable(traffic=[
        split("d", "m", v1=100), cpb.TrafficSplit(deployment="d", model="m", adapter="sql", weights={"v1": 1, "v2": 1})])))
    assert router.traffic("m") == {"v1": 100} and router.traffic("m", "sql") == {"v1": 1, "v2": 1}
    assert set(picks(router, "m", 4)) == {"v1"}                         # the base model: v1 alone
    sql = [router.pick("m", RouteRequest([1], 1, lora="sql")).version for _ in range(4)]
    assert sorted(sql) == ["v1", "v1", "v2", "v2"]                      # v2 gets its half, in a slot or not
    assert router.traffic("m", "poet") == {"v1": 100}                   # another adapter: the model's split
