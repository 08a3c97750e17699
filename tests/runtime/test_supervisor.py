"""`Supervisor`: a service that dies is started again after a backoff that doubles with each quick
death and starts afresh after a stable run; deaths and restarts are counted; `on_ready` runs after
each restart. Real child processes (tiny Python programs), a virtual clock for the backoff."""

from __future__ import annotations

import sys

from mindmotor.common.waiting import wait_until
from mindmotor.runtime.backoff import RestartBackoff
from mindmotor.runtime.supervisor import RUNNING, STARTING, WAITING, Service, Supervisor
from mindmotor.runtime.supervisor_metrics import SupervisorMetrics

READY = "SVC_READY"
SERVE = f"import time; print('{READY} port=1', flush=True); time.sleep(60)"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_dead_service_is_restarted_with_a_doubling_backoff(tmp_path):
    clock, metrics, readied = Clock(), SupervisorMetrics(), []
    supervisor = Supervisor(tmp_path, RestartBackoff(1.0, 4.0), stable_after_s=10.0, metrics=metrics, clock=clock)
    service = supervisor.start(Service("svc", lambda: ["-c", SERVE], READY, program=[sys.executable],
                                       on_ready=lambda s: readied.append(s.child.proc.pid)), timeout_s=30)
    try:
        delays = []
        for death in range(4):
            pid = service.child.proc.pid
            service.child.proc.kill()
            service.child.proc.wait()
            clock.now += 1.0                                     # quick deaths: 1 s after each start
            supervisor.check()
            assert service.state == WAITING and service.failures == death + 1
            delay = supervisor.backoff.delay(service.failures)
            delays.append(delay)
            clock.now += delay - 0.01
            supervisor.check()
            assert service.state == WAITING                      # not before its time
            clock.now += 0.01
            supervisor.check()
            assert service.state == STARTING and service.child.proc.pid != pid
            wait_until(lambda: (supervisor.check(), service.state)[1] == RUNNING, timeout=30, interval=0.05,
                       what="the restart ready")
        assert delays == [1.0, 2.0, 4.0, 4.0]
        assert len(set(readied)) == 4                               # on_ready once per restart
        assert metrics.restarts.labels("svc")._value.get() == 4
        assert metrics.deaths.labels("svc")._value.get() == 4

        clock.now += 60.0                                        # a long, stable run, then a death
        service.child.proc.kill()
        service.child.proc.wait()
        supervisor.check()
        assert service.failures == 1 and supervisor.backoff.delay(service.failures) == 1.0
    finally:
        supervisor.stop(["svc"])
    assert not service.child.alive()
