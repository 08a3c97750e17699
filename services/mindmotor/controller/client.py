"""Clients of the Controller, for the other services.

- `InstanceAgent` (a worker): register, heartbeat with load, obey commands, fail over.
- `RoutingTableWatcher` (a coordinator): keep the routing table current from `Watch`; report
  failed instances.

See `agent` and `watcher` for how each is used.
"""

from .agent import InstanceAgent, InstanceLoad, RegistrationRejected
from .watcher import RoutingTableWatcher

__all__ = ["InstanceAgent", "InstanceLoad", "RegistrationRejected", "RoutingTableWatcher"]
