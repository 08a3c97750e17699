"""`ControllerMetrics`: the controller's Prometheus series, in a registry of its own (so several
controllers can live in one process, e.g. in tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from mindmotor.vocabulary import INSTANCE_STATES_LISTED, InstanceState
from mindmotor.protocol import controller_pb2

from .records import InstanceRecord


class ControllerMetrics:
    def __init__(self, controller_id: str):
        self.registry = CollectorRegistry()
        r = self.registry
        self.instances = Gauge("mindmotor_controller_instances", "Registered instances by health state",
                               ["state"], registry=r)
        self.heartbeats = Counter("mindmotor_controller_heartbeats_received",
                                  "Heartbeats received by this controller", registry=r)
        self.registrations = Counter("mindmotor_controller_registrations",
                                     "Register calls accepted by this controller", registry=r)
        self.registrations_refused = Counter(
            "mindmotor_controller_registrations_refused",
            "Register/Heartbeat/Deregister calls refused: the instance id is bound to another identity or address",
            registry=r)
        self.failures_reported = Counter("mindmotor_controller_failures_reported",
                                         "ReportFailure calls received by this controller", registry=r)
        self.transitions = Counter("mindmotor_controller_state_transitions",
                                   "Health state changes made by this controller's sweeps", ["to"], registry=r)
        self.is_leader = Gauge("mindmotor_controller_is_leader",
                               "1 if this controller holds the leader lease", ["controller_id"], registry=r)
        self.routing_version = Gauge("mindmotor_controller_routing_table_version",
                                     "Version of the routing table this controller serves", registry=r)
        self.watchers = Gauge("mindmotor_controller_watchers", "Open Watch streams", registry=r)
        self.heartbeat_streams = Gauge("mindmotor_controller_heartbeat_streams", "Open Heartbeat streams",
                                       registry=r)
        self.pd_decisions = Counter("mindmotor_controller_pd_decisions",
                                    "P/D ratio policy evaluations by action (none | to_prefill | to_decode) "
                                    "and reason code", ["action", "reason"], registry=r)
        self.pd_ratio = Gauge("mindmotor_controller_pd_ratio",
                              "Routable prefill instances per routable decode instance",
                              ["model", "deployment"], registry=r)
        self.pd_instances = Gauge("mindmotor_controller_pd_instances", "Routable instances by P/D role",
                                  ["model", "deployment", "role"], registry=r)
        self.pd_ttft_p90 = Gauge("mindmotor_controller_pd_ttft_p90_seconds",
                                 "p90 TTFT of the prefill side, as the P/D policy last measured it",
                                 ["model", "deployment"], registry=r)
        self.pd_tpot_p90 = Gauge("mindmotor_controller_pd_tpot_p90_seconds",
                                 "p90 TPOT of the decode side, as the P/D policy last measured it",
                                 ["model", "deployment"], registry=r)
        self.store_resets = Counter("mindmotor_controller_store_resets",
                                    "Times the store came back without its data (its epoch changed)", registry=r)
        self.kept_instances = Gauge("mindmotor_controller_kept_instances",
                                    "Instances listed from the last good routing table after a store data "
                                    "loss, not yet re-registered", registry=r)
        self.controller_id = controller_id
        self.set_leader(False)
        for state in InstanceState:
            self.instances.labels(state).set(0)

    def set_leader(self, leader: bool) -> None:
        self.is_leader.labels(self.controller_id).set(1 if leader else 0)

    def on_rebuild(self, table: controller_pb2.RoutingTable, records: list[InstanceRecord]) -> None:
        counts = dict.fromkeys(InstanceState, 0)
        for record in records:
            counts[record.state] = counts.get(record.state, 0) + 1
        for state, count in counts.items():
            self.instances.labels(state).set(count)
        self.routing_version.set(table.version)
        from_store = {r.instance_id for r in records if r.state in INSTANCE_STATES_LISTED}
        self.kept_instances.set(sum(1 for i in table.instances if i.instance_id not in from_store))

    def render(self) -> bytes:
        return generate_latest(self.registry)
