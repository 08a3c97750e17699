"""The coordinator's Redis rate limiter when its Redis (a redis-server of the test's own) hangs or is
away: requests are let through (fail open) and counted; after one failed call Redis is skipped
(a circuit breaker), so a hung Redis costs one timeout, not one per request; the outage is logged
once; when Redis answers again the limit applies again."""

from __future__ import annotations

import logging
import threading
import uuid

import httpx

from mindmotor.common.circuit_breaker import CircuitBreaker
from mindmotor.common.redis_testing import RedisServer

from .processes import wait_until

ALPHA = {"Authorization": "Bearer sk-alpha"}


def fail_open(c, reason: str) -> float:
    return c.coordinator.metrics.registry.get_sample_value("mindmotor_coordinator_rate_limit_fail_open_total",
                                                           {"reason": reason}) or 0.0


def test_a_hung_or_absent_redis_lets_requests_through_once_per_outage(make_coordinator, virtual_workers, caplog):
    caplog.set_level(logging.INFO, logger="mindmotor.coordinator")
    with RedisServer() as server:
        c = make_coordinator(workers=[virtual_workers[0].address], api_keys=["sk-alpha"], rate_limit_rpm=6,
                             rate_limit_burst=2, redis_url=server.url, redis_prefix=f"rl-{uuid.uuid4().hex}:",
                             rate_limit_redis_timeout_s=0.5, rate_limit_redis_skip_s=1.0)
        with httpx.Client(base_url=c.url, timeout=10) as http:
            assert [http.get("/v1/models", headers=ALPHA).status_code for _ in range(3)] == [200, 200, 429]

            server.freeze()                                   # accepts, never answers
            assert [http.get("/v1/models", headers=ALPHA).status_code for _ in range(4)] == [200] * 4
            assert fail_open(c, "error") == 1                 # one call timed out ...
            assert fail_open(c, "skipped") == 3               # ... the next ones did not wait for Redis
            server.thaw()
            # after the skip window one probe goes to Redis again: the bucket is still empty
            wait_until(lambda: http.get("/v1/models", headers=ALPHA).status_code == 429, timeout=10)

            server.stop()                                     # away: connection refused
            assert http.get("/v1/models", headers=ALPHA).status_code == 200
            assert fail_open(c, "error") == 2
    outages = [r for r in caplog.records if r.getMessage().startswith("rate limit store unavailable")]
    recoveries = [r for r in caplog.records if r.getMessage() == "rate limit store answers again"]
    assert len(outages) == 2 and len(recoveries) == 1        # logged once per outage, not per request


def test_the_breaker_skips_until_a_single_probe_succeeds():
    now = [0.0]
    breaker = CircuitBreaker(open_s=5.0, clock=lambda: now[0])
    assert breaker.allow() and not breaker.succeeded()
    assert breaker.failed() and not breaker.failed()          # only the first failure opens it
    assert not breaker.allow()
    now[0] = 5.0
    assert breaker.allow() and not breaker.allow()            # one probe at a time
    assert not breaker.failed()                               # the probe failed: open for 5 s more
    now[0] = 9.9
    assert not breaker.allow()
    now[0] = 10.0
    assert breaker.allow() and breaker.succeeded()            # closed again
    assert breaker.allow() and breaker.allow()
    breaker.failed()                                          # a probe whose caller never reports back ...
    now[0] = 15.0
    assert breaker.allow() and not breaker.allow()
    now[0] = 20.0
    assert breaker.allow()                                    # ... is replaced after open_s


def test_a_controller_redis_restarted_empty_causes_no_503(make_coordinator, tiny_ckpt, model_name, tmp_path):
    """Real workers registered with a controller on a redis-server of its own; the coordinator
    watches the controller. Redis restarts without its data while requests flow: every request is
    answered, the workers re-register."""
    from .processes import start_controller, start_workers

    with RedisServer() as server:
        ctrl = start_controller(tmp_path / "controller.log", "--redis-url", server.url, "--heartbeat-interval", "0.2",
                                "--suspect-misses", "3", "--dead-after", "1.5")
        workers = []
        try:
            workers = start_workers(tiny_ckpt, tmp_path, 2, "--timing", "virtual", "--controller", ctrl.address)
            c = make_coordinator(controllers=[ctrl.address])
            wait_until(lambda: sum(v.healthy for v in c.coordinator.table.all()) == 2, timeout=15)
            admin = ctrl.admin_url

            def stored() -> set[str]:
                try:
                    return {r["instance_id"] for r in httpx.get(admin + "/v1/instances", timeout=5).json()["data"]
                            if r["state"] == "ready"}
                except (httpx.HTTPError, ValueError, KeyError):
                    return set()

            ids = stored()
            assert len(ids) == 2
            codes: list[int] = []
            healthy: list[int] = []                           # the coordinator's routable count, sampled
            watching = threading.Event()

            def watch() -> None:
                while not watching.wait(0.002):
                    healthy.append(sum(v.healthy for v in c.coordinator.table.all()))

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            body = {"model": model_name, "prompt": "hello", "max_tokens": 2}
            with httpx.Client(base_url=c.url, timeout=30) as http:
                def send() -> None:
                    codes.append(http.post("/v1/completions", json=body).status_code)

                for _ in range(5):
                    send()
                server.restart()                              # every key gone
                wait_until(lambda: send() or stored() == ids, timeout=20, what="both workers re-registered")
                for _ in range(5):
                    send()
            watching.set()
            watcher.join()
            assert len(codes) > 10 and set(codes) == {200}, codes
            assert min(healthy) == 2, sorted(set(healthy))    # not even a moment without both workers
        finally:
            for w in workers:
                w.stop()
            ctrl.stop()
