"""The controller adapter: routing tables from a (fake) watcher replace the local table; failures
this coordinator sees are reported back."""

from __future__ import annotations

import asyncio

from mindmotor.common.roles import Role
from mindmotor.coordinator.routing.controller_source import ControllerSource, view_from_info
from mindmotor.coordinator.routing.table import RoutingTable
from mindmotor.protocol import controller_pb2 as cpb


def info(instance_id: str, **fields) -> cpb.InstanceInfo:
    defaults = dict(address=f"{instance_id}:1", model="m", role=Role.MIXED.to_proto(), routable=True, block_size=16,
                    max_model_len=1024)
    return cpb.InstanceInfo(instance_id=instance_id, **{**defaults, **fields})


def test_view_from_info():
    v = view_from_info(info("w1", weight=0, version="v2", deployment="d",
                            load=cpb.InstanceLoad(running=3, waiting=1, kv_usage=0.5)))
    assert (v.instance_id, v.address, v.model, v.weight, v.version, v.deployment) == ("w1", "w1:1", "m", 1.0, "v2", "d")
    assert (v.running, v.waiting, v.kv_usage, v.max_model_len, v.healthy) == (3, 1, 0.5, 1024, True)
    assert not view_from_info(info("w2", routable=False, state="suspect")).healthy


class FakeWatcher:
    def __init__(self, addresses, on_update):
        self.on_update = on_update
        self.reports = []

    async def start(self):
        self.on_update(cpb.RoutingTable(version=1, instances=[info("a"), info("b", routable=False)]))

    async def wait_for(self, predicate, timeout):
        return None

    async def report_failure(self, instance_id, reason, reporter=""):
        self.reports.append((instance_id, reason, reporter))
        return True

    async def stop(self):
        pass


def test_controller_source_replaces_the_table_and_reports_failures():
    async def run():
        table = RoutingTable()
        source = ControllerSource(["ctrl:1"], table, reporter="coord-1", make_watcher=FakeWatcher)
        await source.start()
        assert [v.instance_id for v in table.candidates("m")] == ["a"]
        source.watcher.on_update(cpb.RoutingTable(version=2, instances=[info("c")]))
        assert [v.instance_id for v in table.all()] == ["c"]
        table.mark_failed("c", "UNAVAILABLE: connection refused")
        await asyncio.sleep(0)
        await asyncio.gather(*source._reports)
        await source.stop()
        return source.watcher.reports

    assert asyncio.run(run()) == [("c", "UNAVAILABLE: connection refused", "coord-1")]
