"""A failure mark belongs to the process that failed: the instance id at the address it failed at.
A replacement registering under the same id at a new address (a restarted replica) is routed to
at once; the dead address stays skipped for `suspect_s`."""

from __future__ import annotations

from mindmotor.coordinator.routing.table import InstanceView, RoutingTable
from fake_clock import FakeClock


def test_a_replacement_at_a_new_address_does_not_inherit_the_mark():
    clock = FakeClock()
    table = RoutingTable(suspect_s=5.0, clock=clock)
    heard = []
    table.on_failure(lambda view, reason: heard.append((view.address, reason)))
    table.upsert(InstanceView("demo-v1-0", "127.0.0.1:5001", model="m"))
    table.upsert(InstanceView("demo-v1-1", "127.0.0.1:5002", model="m"))

    table.mark_failed("demo-v1-0", "unavailable")
    assert heard == [("127.0.0.1:5001", "unavailable")]
    assert [v.instance_id for v in table.candidates("m")] == ["demo-v1-1"]

    # the same process seen again (a routing table repeating it): still skipped
    table.replace([InstanceView("demo-v1-0", "127.0.0.1:5001", model="m"),
                   InstanceView("demo-v1-1", "127.0.0.1:5002", model="m")])
    assert not table.is_routable(table.get("demo-v1-0"))

    # its replacement registers under the same id at another port: routable at once
    table.replace([InstanceView("demo-v1-0", "127.0.0.1:6001", model="m"),
                   InstanceView("demo-v1-1", "127.0.0.1:5002", model="m")])
    assert [v.instance_id for v in table.candidates("m")] == ["demo-v1-0", "demo-v1-1"]
    assert table.has_routable("m")

    # the replacement failing is marked in its own right
    table.mark_failed("demo-v1-0", "internal")
    assert not table.is_routable(table.get("demo-v1-0"))
    clock.now += 5.0
    assert table.is_routable(table.get("demo-v1-0"))
