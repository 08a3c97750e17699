"""`DeployerMetrics`: the deployer's Prometheus series, in a registry of its own, served on the
`--metrics-port` side port. The per-version gauges are rewritten from every reconcile pass, so a
removed version or deployment disappears from them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mindmotor.vocabulary import RolloutPhase


class DeployerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        p = "mindmotor_deployer_"
        per_version = ["deployment", "version"]
        self.desired = Gauge(p + "desired_replicas", "Replicas the spec asks for", per_version, registry=r)
        self.actual = Gauge(p + "actual_replicas", "Replicas the backend runs (starting or serving)",
                            per_version, registry=r)
        self.ready = Gauge(p + "ready_replicas", "Instances of the version routable in the controller",
                           per_version, registry=r)
        self.weight = Gauge(p + "traffic_weight", "Traffic weight of the version", per_version, registry=r)
        self.actions = Counter(p + "reconcile_actions", "Actions the reconcile loop took, by kind "
                               "(scale, restart, remove, traffic, rollout_ready, rollout_failed, rollout_analysis_failed, "
                               "forget)",
                               ["deployment", "version", "action"], registry=r)
        self.restarts = Counter(p + "restarts", "Crashed replicas started again", per_version, registry=r)
        self.rollout = Gauge(p + "rollout_phase", "1 for the phase of the deployment's last rollout",
                             ["deployment", "phase"], registry=r)
        self.passes = Histogram(p + "reconcile_duration_seconds", "Time of one reconcile pass",
                                buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5), registry=r)
        self.store_resets = Counter(p + "store_resets", "Times the store came back without its data (its epoch "
                                    "changed); replicas no record names were kept for the orphan grace", registry=r)
        self.kept_orphans = Gauge(p + "kept_orphans", "Replicas no deployment record names, kept after a store "
                                  "reset until their specs are applied again or the grace passes", registry=r)
        self.errors = Counter(p + "reconcile_errors", "Reconcile passes that failed", ["reason"], registry=r)
        self.coordinator_reads = Counter(p + "coordinator_metrics_reads", "Reads of a coordinator's /metrics for "
                                         "canary analysis, by outcome (ok, failed)", ["outcome"], registry=r)
        self.owner = Gauge(p + "owner", "1 while this deployer holds the owner lease (acts), 0 on standby",
                           registry=r)

    def set_versions(self, rows: list[tuple[str, str, int, int, int, float]]) -> None:
        """(deployment, version, desired, actual, ready, weight) for every version there is."""
        for gauge in (self.desired, self.actual, self.ready, self.weight):
            gauge.clear()
        for deployment, version, desired, actual, ready, weight in rows:
            self.desired.labels(deployment, version).set(desired)
            self.actual.labels(deployment, version).set(actual)
            self.ready.labels(deployment, version).set(ready)
            self.weight.labels(deployment, version).set(weight)

    def set_rollouts(self, phases: dict[str, str]) -> None:
        """deployment -> phase of its last rollout."""
        self.rollout.clear()
        for deployment, phase in phases.items():
            for name in RolloutPhase:
                self.rollout.labels(deployment, name).set(1 if name == phase else 0)

    def serve(self, host: str, port: int) -> tuple[object, int]:
        """Start /metrics on a daemon thread; (server, bound port)."""
        from mindmotor.common.https_side import serve_metrics

        return serve_metrics(host, port, self.registry)
