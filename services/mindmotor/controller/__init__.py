"""The Controller: the cluster's registry of serving instances, their health and roles, and the
routing table it streams to every coordinator.

    registry (records in a Store) ── heartbeats / registrations / failure reports ── workers
        │                                        coordinators ◀── Watch (routing table)
        └── leader only: health sweeps (suspect / dead timeouts), through a Store lease

Modules: `config` (settings), `states` (the health state machine), `records` (one instance),
`registry` (records in the store), `routing` (the routing table and its broadcast), `leader`
(the lease), `sweeper` (timeouts), `service` (gRPC), `admin` (HTTP), `metrics`, `server`
(wiring, lifecycle), `cli`; and for the other services, `client` (`InstanceAgent` from
`agent`, `RoutingTableWatcher` from `watcher`, both reconnecting through `reconnect`).
"""
