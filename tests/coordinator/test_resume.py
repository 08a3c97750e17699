"""Resuming a cut stream on another coordinator (coordinator/dispatch/resume.py): two coordinators that
share a resume key, one worker. A client reads part of a greedy stream from the first, its
connection breaks, it sends the same request to the second with `Last-Event-ID`: the second
continues right after the last event — the text joined is the undisturbed run's, no token repeated
or generated again — with the same response id. Forged, foreign or stale ids are refused."""

from __future__ import annotations

import json

import httpx
import pytest

from .processes import wait_until

KEY = "resume-test-key"


def sse(response: httpx.Response):
    """(id or None, data) of each event."""
    event_id = None
    for line in response.iter_lines():
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            yield event_id, line[6:]
            event_id = None


def text_of(data: str) -> str:
    body = json.loads(data)
    choice = (body.get("choices") or [{}])[0]
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


@pytest.fixture(scope="module")
def pair(realtime_worker, tiny_ckpt):
    from .processes import InProcessCoordinator

    made = [InProcessCoordinator(workers=[realtime_worker.address], model_dir=str(tiny_ckpt), resume_key=KEY)
            for _ in range(2)]
    for c in made:
        wait_until(lambda c=c: c.coordinator.table.has_routable(), what="the worker routable")
    yield made
    for c in made:
        c.stop()


def body(model: str, path: str) -> dict:
    options = {"include_usage": True, "continuous_usage_stats": True}
    if path == "/v1/completions":
        return {"model": model, "prompt": "def f(x):", "max_tokens": 60, "temperature": 0, "stream": True,
                "ignore_eos": True, "stream_options": options}
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 60, "temperature": 0,
            "stream": True, "ignore_eos": True, "stream_options": options}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_cut_stream_continues_on_another_coordinator(pair, model_name, path):
    first, second = pair
    with httpx.stream("POST", first.url + path, json=body(model_name, path), timeout=60) as r:
        whole = [(i, d) for i, d in sse(r)]
    undisturbed = "".join(text_of(d) for _, d in whole if d != "[DONE]")
    assert all(i for i, d in whole if d != "[DONE]"), "every event has an id"

    got, last_id, response_id = "", None, None
    with httpx.stream("POST", first.url + path, json=body(model_name, path), timeout=60) as r:
        for event_id, data in sse(r):
            got += text_of(data)
            last_id, response_id = event_id, json.loads(data)["id"]
            if len(got) >= 12:
                break                                   # the connection breaks here
    with httpx.stream("POST", second.url + path, json=body(model_name, path), timeout=60,
                      headers={"Last-Event-ID": last_id}) as r:
        assert r.status_code == 200
        rest = list(sse(r))
    assert rest[-1][1] == "[DONE]"
    assert got + "".join(text_of(d) for _, d in rest[:-1]) == undisturbed
    usage = json.loads(rest[-2][1])["usage"]
    assert usage["completion_tokens"] == 60
    running = [json.loads(d)["usage"]["completion_tokens"] for _, d in rest[:-2]]
    assert running == sorted(running) and running[-1] == 60      # continuous usage counts on, not from 0
    assert {json.loads(d)["id"] for _, d in rest[:-1]} == {response_id}
    assert second.coordinator.metrics.stream_resumes.labels("resumed")._value.get() >= 1


def test_forged_foreign_and_stale_ids_are_refused(pair, model_name):
    first, second = pair
    path = "/v1/completions"
    with httpx.stream("POST", first.url + path, json=body(model_name, path), timeout=60) as r:
        last_id = next(i for i, _ in sse(r))
    forged = last_id[:-2] + ("AA" if not last_id.endswith("AA") else "BB")
    other = {**body(model_name, path), "prompt": "another prompt"}
    for id_, request, status, code in [(forged, body(model_name, path), 400, "invalid_last_event_id"),
                                       ("garbage", body(model_name, path), 400, "invalid_last_event_id"),
                                       (last_id, other, 400, "invalid_last_event_id")]:
        response = httpx.post(second.url + path, json=request, headers={"Last-Event-ID": id_}, timeout=60)
        assert response.status_code == status, response.text
        assert response.json()["error"]["code"] == code and response.json()["error"]["param"] == "Last-Event-ID"
