"""The front-door benchmarks' load generation (benchmarks/common.py) against a real HTTP server in
this process, the /proc CPU accounting on a real child process, and the design arithmetic of
front_door_scale.py on given levels (seconds; no timed assertions)."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import front_door_scale, up_throughput  # noqa: E402
from benchmarks.common import (HTTPConnection, best_under_p99, closed_loop, completion_body, cpu_s,  # noqa: E402
                               measure_level, process_tree, strict_json)


class TinyServer:
    """An asyncio HTTP/1.1 keep-alive server on a free port, in a thread: `POST /ok` answers 200
    with a Content-Length body, `POST /chunked` 200 chunked, anything else 429."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def _serve(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                length = next(int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length"))
                body = json.loads(await reader.readexactly(length)) if length else None
                path = lines[0].split()[1]
                if path == "/ok":
                    data = json.dumps({"echo": body}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
                elif path == "/chunked":
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
                else:
                    writer.write(b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def close(self):
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def server():
    s = TinyServer()
    yield s
    s.close()


def test_connection_reads_length_and_chunked_bodies_on_one_keep_alive_connection(server):
    async def go():
        conn = HTTPConnection("127.0.0.1", server.port, headers={"Authorization": "Bearer k"})
        status, data = await conn.request("POST", "/ok", completion_body("m", 1))
        assert status == 200 and json.loads(data)["echo"]["max_tokens"] == 1
        assert await conn.request("POST", "/chunked", b"") == (200, b"abcde")
        assert (await conn.request("POST", "/ok", b"{}"))[0] == 200
        conn.close()
    asyncio.run(go())


def test_closed_loop_counts_answers_and_errors(server):
    ok = asyncio.run(closed_loop("127.0.0.1", server.port, "/ok", b"{}", 3, 0.3, 0.05))
    assert ok["requests"] > 0 and ok["rps"] == ok["requests"] / 0.3 and not ok["errors"]
    assert ok["p50_ms"] <= ok["p99_ms"]
    refused = asyncio.run(closed_loop("127.0.0.1", server.port, "/other", b"{}", 2, 0.2, 0.0))
    assert refused["requests"] == 0 and refused["errors"]["http_429"] > 0 and math.isnan(refused["p99_ms"])


def test_measure_level_reports_cores_and_cpu_per_request(server):
    row = measure_level("127.0.0.1", server.port, "/ok", b"{}", 2, 0.3, 0.05, {"nothing": lambda: 0.0})
    assert row["cpu_cores"]["nothing"] == 0.0 and row["cpu_cores"]["client"] >= 0
    assert row["cpu_ms_per_request"]["nothing"] == 0.0


def test_process_tree_and_cpu_of_a_child():
    child = subprocess.Popen([sys.executable, "-c", "import time\nx = 0\nfor i in range(3_000_000): x += i\n"
                              "print('done', flush=True)\ntime.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "done"
        import os
        me = os.getpid()
        assert child.pid in process_tree(me) and me in process_tree(me)
        assert cpu_s([child.pid]) > 0 and cpu_s([2**22 + 12345]) == 0     # a pid that does not exist
    finally:
        child.kill()
        child.wait()


def test_best_under_p99_and_strict_json():
    levels = [{"rps": 100, "p99_ms": 10, "errors": {}}, {"rps": 300, "p99_ms": 70, "errors": {}},
              {"rps": 400, "p99_ms": 90, "errors": {}}, {"rps": 350, "p99_ms": 60, "errors": {"http_503": 1}}]
    assert best_under_p99(levels, 80)["rps"] == 300
    assert best_under_p99(levels, 5) is None
    assert strict_json({"a": [float("nan"), 1.0], "b": (float("nan"),)}) == {"a": [None, 1.0], "b": [None]}


def _level(c, rps, p99, coordinators, workers=0.5):
    return {"concurrency": c, "rps": rps, "p99_ms": p99, "errors": {},
            "cpu_cores": {"coordinators": coordinators, "workers": workers},
            "cpu_ms_per_request": {"coordinators": coordinators * 1000 / rps, "workers": workers * 1000 / rps}}


def test_design_arithmetic_from_the_one_replica_levels():
    rows = {1: {"levels": [_level(8, 400, 30, 0.8), _level(32, 500, 95, 1.0)]},
            2: {"levels": [_level(8, 600, 30, 1.5)]}}
    d = front_door_scale.design(rows)
    assert d["coordinator_cpu_ms_per_request"] == pytest.approx(2.0)        # peak level: 1.0 core / 500 req/s
    assert d["rps_per_coordinator_core"] == pytest.approx(500)
    assert d["coordinator_cores_needed"] == pytest.approx(10.0)             # 5,000 x 2 ms
    assert d["one_replica_rps_p99_under_80ms_per_full_core"] == pytest.approx(500)   # 400 req/s on 0.8 core
    assert d["replicas_needed_p99"] == 10
    assert d["replicas_needed_at_hpa_target"] == math.ceil(5000 / (500 * 0.7)) == 15
    assert d["replicas_needed"] == 15
    assert "ceil(5000 / 500) = 10" in d["arithmetic"]
    no_p99 = front_door_scale.design({1: {"levels": [_level(8, 100, 300, 0.4)]}})
    assert no_p99["replicas_needed_p99"] is None and no_p99["replicas_needed"] == math.ceil(5000 / (250 * 0.7))
    assert "no 1-replica level" in no_p99["arithmetic"]


def test_up_services_are_told_apart_by_their_command_line():
    import os
    assert up_throughput.service_of(os.getpid()) == "up"
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(30)", "mindmotor.cli", "worker"])
    try:
        import time
        for _ in range(200):                       # until the exec has replaced the command line
            if up_throughput.service_of(child.pid) == "worker":
                break
            time.sleep(0.01)
        assert up_throughput.service_of(child.pid) == "worker"
    finally:
        child.kill()
        child.wait()
