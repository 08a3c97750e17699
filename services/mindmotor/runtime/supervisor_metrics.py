"""`SupervisorMetrics`: what a `Supervisor` counts, per service — restarts, deaths, liveness kills,
and whether it is up. `mindmotor up` serves them on its /metrics (launcher/up.py); the names keep
the `mindmotor_up_` prefix they were first published under (docs/operations.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class SupervisorMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.restarts = Counter("mindmotor_up_restarts", "Services `mindmotor up` started again after they died",
                                ["service"], registry=self.registry)
        self.deaths = Counter("mindmotor_up_deaths", "Supervised services that exited without being asked to",
                              ["service"], registry=self.registry)
        self.liveness_kills = Counter("mindmotor_up_liveness_kills", "Services SIGKILLed (then restarted) after "
                                      "failing their liveness probe", ["service"], registry=self.registry)
        self.up = Gauge("mindmotor_up_service_up", "1 while the service runs and has printed its ready line",
                        ["service"], registry=self.registry)
