"""Stored responses stay within their bounds (time to live, count, bytes) and, in a SQLite file,
are shared by every coordinator process that opens it (replicas on one machine)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from fake_clock import FakeClock

from mindmotor.coordinator.openai.responses.store import MemoryStore, SQLiteStore, StoreLimits


def record(i: int, pad: int = 0) -> dict:
    return {"response": {"id": f"resp_{i}"}, "conversation": [{"text": "x" * pad}], "input": []}


@pytest.fixture(params=["memory", "sqlite"])
def make(request, tmp_path):
    def make(limits: StoreLimits, clock: FakeClock):
        if request.param == "memory":
            return MemoryStore(limits, clock)
        return SQLiteStore(str(tmp_path / "responses.db"), limits, clock)
    return make


def run(coro):
    return asyncio.run(coro)


def test_ttl_count_and_byte_bounds_drop_the_oldest(make):
    clock = FakeClock()
    store = make(StoreLimits(ttl_s=60, max_responses=3, max_bytes=10_000), clock)
    for i in range(5):
        run(store.put(f"resp_{i}", record(i)))
        clock.advance(1)
    assert [run(store.get(f"resp_{i}")) is not None for i in range(5)] == [False, False, True, True, True]
    run(store.put("big", record(9, pad=9_000)))           # past the bytes: older ones go, the new one stays
    assert run(store.get("big"))["response"]["id"] == "resp_9"
    assert run(store.get("resp_2")) is None
    clock.advance(61)
    assert run(store.get("big")) is None                   # expired
    assert run(store.delete("resp_4")) is False


def test_delete(make):
    store = make(StoreLimits(), FakeClock())
    run(store.put("a", record(1)))
    assert run(store.delete("a")) is True and run(store.get("a")) is None


def test_a_sqlite_store_is_shared_across_processes(tmp_path):
    path = str(tmp_path / "shared.db")
    here = SQLiteStore(path, StoreLimits())
    run(here.put("resp_here", record(1)))
    script = ("import asyncio, json, sys; from mindmotor.coordinator.openai.responses.store import SQLiteStore, "
              "StoreLimits; s = SQLiteStore(sys.argv[1], StoreLimits()); "
              "print(json.dumps(asyncio.run(s.get('resp_here')))); "
              "asyncio.run(s.put('resp_there', {'response': {'id': 'resp_there'}, 'conversation': [], 'input': []}))")
    out = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout)["response"]["id"] == "resp_1"
    assert run(here.get("resp_there"))["response"]["id"] == "resp_there"
