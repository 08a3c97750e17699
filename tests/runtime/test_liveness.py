"""Liveness: a supervised service that is alive but answers nothing (SIGSTOP) is SIGKILLed after
`failures` probes in a row without an answer and restarted (counted); one that answers, even with a
503, is left alone; with liveness off a frozen service is never touched. Real child processes (a
tiny HTTP server), real HTTP probes; a virtual clock spaces the probes."""

from __future__ import annotations

import os
import signal
import sys

from mindmotor.common.waiting import wait_until
from mindmotor.runtime.backoff import RestartBackoff
from mindmotor.runtime.liveness import LivenessProbe, LivenessSettings
from mindmotor.runtime.supervisor import RUNNING, Service, Supervisor
from mindmotor.runtime.supervisor_metrics import SupervisorMetrics

READY = "SVC_READY"
# an HTTP server on a free port answering 503 to everything (liveness is not readiness)
SERVE = f"""
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(503); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print("{READY} port=%d" % s.server_port, flush=True)
s.serve_forever()
"""
FAST = LivenessSettings(interval_s=1.0, timeout_s=0.3, failures=2)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def start(tmp_path, settings: LivenessSettings):
    clock, metrics = Clock(), SupervisorMetrics()
    supervisor = Supervisor(tmp_path, RestartBackoff(0.1, 0.1), stable_after_s=10.0, metrics=metrics, clock=clock)
    service = Service("svc", lambda: ["-c", SERVE], READY, program=[sys.executable])
    service.liveness = LivenessProbe(settings, url=lambda: f"http://127.0.0.1:{service.ready['port']}/health")
    supervisor.start(service, timeout_s=30)
    return supervisor, service, clock, metrics


def tick(supervisor, clock) -> None:
    clock.now += 0.5
    supervisor.check()


def test_a_frozen_service_is_killed_and_restarted(tmp_path):
    supervisor, service, clock, metrics = start(tmp_path, FAST)
    try:
        wait_until(lambda: (tick(supervisor, clock), service.liveness.probes)[1] >= 3, timeout=30, interval=0.05,
                   what="three answered probes")
        assert service.child.alive() and service.liveness.misses == 0      # a 503 is an answer
        frozen = service.child.proc.pid
        os.kill(frozen, signal.SIGSTOP)
        wait_until(lambda: (tick(supervisor, clock), service.state == RUNNING and service.child.proc.pid != frozen)[1],
                   timeout=30, interval=0.05, what="the frozen service killed and restarted")
        assert metrics.liveness_kills.labels("svc")._value.get() == 1
        assert metrics.restarts.labels("svc")._value.get() == 1
        assert not os.path.exists(f"/proc/{frozen}")                         # SIGKILLed and reaped
        probes = service.liveness.probes
        wait_until(lambda: (tick(supervisor, clock), service.liveness.probes)[1] >= probes + 2, timeout=30,
                   interval=0.05, what="the restarted service probed")
        assert service.liveness.misses == 0
    finally:
        supervisor.stop(["svc"])


def test_liveness_off_leaves_a_frozen_service_alone(tmp_path):
    supervisor, service, clock, metrics = start(tmp_path, LivenessSettings(enabled=False, interval_s=1.0,
                                                                           timeout_s=0.3, failures=1))
    frozen = service.child.proc.pid
    os.kill(frozen, signal.SIGSTOP)
    try:
        for _ in range(40):                       # 20 virtual seconds: 20 probe periods
            tick(supervisor, clock)
        assert service.child.proc.pid == frozen and service.child.alive() and service.liveness.probes == 0
        assert (metrics.liveness_kills.labels("svc")._value.get()) == 0
    finally:
        os.kill(frozen, signal.SIGCONT)
        supervisor.stop(["svc"])
