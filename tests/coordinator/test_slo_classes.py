"""SLO classes at the coordinator: a class from the API key or X-MindMotor-Class (demote only), its
engine priority, admission by class (a class's share of max_requests; waiters admitted most urgent
class first; bounded waits end in 429), the settings checked at start, and the class on the
metrics (phases, pending queue, SLO attainment)."""

from __future__ import annotations

import asyncio
import hashlib

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mindmotor.coordinator.config import CoordinatorSettings
from mindmotor.coordinator.dispatch.admission import Admission
from mindmotor.coordinator.http.errors import TooManyRequests
from mindmotor.coordinator.metrics import CoordinatorMetrics
from mindmotor.coordinator.slo_classes import DEFAULT_CLASSES, ClassError, SLOClass, resolve


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


BY_KEY = {sha("sk-batch"): "batch", sha("sk-live"): "interactive"}


def test_class_from_key_default_and_demoting_header():
    r = lambda caller, header=None: resolve(DEFAULT_CLASSES, "standard", BY_KEY, caller, header)  # noqa: E731
    assert r(sha("sk-batch")) == "batch" and r(sha("sk-live")) == "interactive" and r(None) == "standard"
    assert r(sha("sk-live"), "Batch") == "batch" and r(None, "standard") == "standard"
    with pytest.raises(ClassError, match="more urgent"):
        r(sha("sk-batch"), "interactive")
    with pytest.raises(ClassError, match="unknown class 'gold'"):
        r(None, "gold")


def test_settings_are_checked(tiny_ckpt):
    base = {"model_dir": str(tiny_ckpt)}
    with pytest.raises(ValueError, match="default_class 'gold'"):
        CoordinatorSettings(**base, default_class="gold")
    with pytest.raises(ValueError, match="SHA-256"):
        CoordinatorSettings(**base, class_by_key={"sk-plain-key": "batch"})
    with pytest.raises(ValueError, match="class 'gold' is not one of"):
        CoordinatorSettings(**base, class_by_key={sha("k"): "gold"})
    with pytest.raises(ValueError):
        CoordinatorSettings(**base, slo_classes={"standard": {"max_share": 0}})


def admission(wait_s: float, max_requests: int = 4) -> Admission:
    return Admission(max_requests, 1, CoordinatorMetrics(), dict(DEFAULT_CLASSES), wait_s)


def test_a_class_holds_at_most_its_share_and_waiters_go_most_urgent_first():
    async def scenario():
        a = admission(wait_s=60)
        batch = [await a.acquire("m", 1, "batch") for _ in range(2)]        # batch's share: 2 of 4
        third = asyncio.ensure_future(a.acquire("m", 1, "batch"))
        await asyncio.sleep(0)
        assert not third.done()                                             # queued, not refused
        live = [await a.acquire("m", 1, "interactive") for _ in range(2)]   # interactive goes past it
        late_live = asyncio.ensure_future(a.acquire("m", 1, "interactive"))  # the model is full now
        await asyncio.sleep(0)
        assert not late_live.done() and a.outstanding["m"] == 4
        batch[0].release()                                # room: the interactive waiter, not the batch one
        assert a.by_class[("m", "interactive")] == 3 and a.by_class[("m", "batch")] == 1   # (taken at release)
        live[0].release()                                 # room, and batch under its share again
        assert a.by_class[("m", "batch")] == 2 and a.by_class[("m", "interactive")] == 2
        for t in (batch[1], live[1], await late_live, await third):
            t.release()
        assert a.outstanding["m"] == 0
    asyncio.run(scenario())


def test_without_a_wait_or_past_it_a_full_class_is_429():
    async def scenario():
        a = admission(wait_s=0)
        [await a.acquire("m", 1, "batch") for _ in range(2)]
        with pytest.raises(TooManyRequests, match="class 'batch': 2 of 2"):
            await a.acquire("m", 1, "batch")
        assert (await a.acquire("m", 1, "standard")) is not None        # other classes are not held up
        b = admission(wait_s=0.05)
        [await b.acquire("m", 1, "batch") for _ in range(2)]
        with pytest.raises(TooManyRequests):
            await b.acquire("m", 1, "batch")
        assert not b._waiters["m"]                                      # the waiter left the queue
    asyncio.run(scenario())


def test_class_over_http(make_coordinator, virtual_workers, model_name):
    classes = {**DEFAULT_CLASSES, "interactive": SLOClass(priority=-10, ttft_s=60, tpot_s=60)}
    coord = make_coordinator(workers=[w.address for w in virtual_workers], api_keys=["sk-batch", "sk-live"],
                             class_by_key=BY_KEY, slo_classes=classes)
    body = {"model": model_name, "prompt": "x", "max_tokens": 3, "ignore_eos": True}
    with httpx.Client(base_url=coord.url, timeout=60) as c:
        live = {"Authorization": "Bearer sk-live"}
        assert c.post("/v1/completions", json=body, headers=live).status_code == 200
        assert c.post("/v1/completions", json=body, headers={**live, "X-MindMotor-Class": "batch"}).status_code == 200
        refused = c.post("/v1/completions", json=body, headers={"Authorization": "Bearer sk-batch",
                                                                "X-MindMotor-Class": "interactive"})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_class"
        assert refused.json()["error"]["param"] == "X-MindMotor-Class"
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(c.get("/metrics").text) for s in f.samples}
    count = lambda cls: samples[("mindmotor_request_phase_seconds_count",  # noqa: E731
                                 (("class", cls), ("model_name", model_name), ("phase", "decode")))]
    assert count("interactive") == 1 and count("batch") == 1
    assert samples[("mindmotor_slo_requests_total", (("class", "interactive"), ("model_name", model_name),
                                                     ("outcome", "met")))] == 1
    assert samples[("mindmotor_pending_queue_size", (("class", "interactive"),))] == 0


def test_one_key_holds_at_most_its_share_of_a_class():
    classes = {**DEFAULT_CLASSES, "batch": SLOClass(priority=10, max_share=1.0, max_key_share=0.5)}

    async def scenario():
        a = Admission(4, 1, CoordinatorMetrics(), classes, wait_s=60)
        mine = [await a.acquire("m", 1, "batch", "key-a") for _ in range(2)]     # key-a's share: 2 of 4
        held = asyncio.ensure_future(a.acquire("m", 1, "batch", "key-a"))
        await asyncio.sleep(0)
        assert a.by_key[("m", "batch", "key-a")] == 2                           # key-a's third waits ...
        other = await a.acquire("m", 1, "batch", "key-b")                       # ... key-b is not held up
        mine[0].release()                                                       # room in key-a's share
        assert a.by_key[("m", "batch", "key-a")] == 2 and a.by_key[("m", "batch", "key-b")] == 1
        for t in (mine[1], other, await held):
            t.release()
        assert not a.by_key and a.outstanding["m"] == 0
        with pytest.raises(TooManyRequests, match="this key: 2 of 2"):
            b = Admission(4, 1, CoordinatorMetrics(), classes, wait_s=0)
            [await b.acquire("m", 1, "batch", "key-a") for _ in range(3)]
    asyncio.run(scenario())
