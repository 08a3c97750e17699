"""`LastGoodTable`: what a controller routes with after its store lost its data.

A Redis restarted without its data (or flushed) comes back with no instance records: the registry
is empty although every worker still runs, and a table built from it would send every coordinator
into 503s until the workers re-register (they do on their next heartbeat: the controller answers an
unknown instance with "re-register"). So when the broadcaster sees the store's epoch change
(`Registry.epoch`), it keeps the instances of its last table as they were until each has
re-registered — its record is back and past `starting` — or `hold_s` has passed (a worker that has
not re-registered by then is gone, as one that misses heartbeats for dead_after is declared dead).

The rule lives here, in the controller, and nowhere else: only the controller can tell a store
that lost its data (the epoch changed) from instances that really left (drained, deregistered, or
dead, which a coordinator must stop routing to at once).
"""

from __future__ import annotations

from mindmotor.vocabulary import InstanceState
from mindmotor.protocol import controller_pb2



class LastGoodTable:
    def __init__(self, table: controller_pb2.RoutingTable, now: float, hold_s: float):
        self.kept = {i.instance_id: i for i in table.instances}
        self.until = now + hold_s

    def merge(self, table: controller_pb2.RoutingTable, now: float) -> None:
        """Add to `table` (built from the store) the kept instances not yet re-registered; forget
        those that have re-registered, and all of them once `hold_s` has passed."""
        present = {i.instance_id: i for i in table.instances}
        for instance_id, info in present.items():
            if info.state != InstanceState.STARTING:
                self.kept.pop(instance_id, None)          # re-registered and heartbeating
        if now >= self.until:
            self.kept.clear()
        missing = [info for instance_id, info in self.kept.items() if instance_id not in present]
        starting = {instance_id for instance_id in self.kept if instance_id in present}
        if starting:                                      # re-registered, first heartbeat pending
            kept_instances = [self.kept[i.instance_id] if i.instance_id in starting else i for i in table.instances]
            del table.instances[:]
            table.instances.extend(kept_instances)
        table.instances.extend(sorted(missing, key=lambda i: i.instance_id))

    @property
    def done(self) -> bool:
        return not self.kept
