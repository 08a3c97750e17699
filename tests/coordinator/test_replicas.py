"""`mindmotor coordinator --replicas 2`: two coordinator processes behind one port, supervised (the
shape `mindmotor up` runs, for a coordinator started alone: a container). Both serve the port; one
SIGKILLed, requests keep being answered on the same port and the replica is back on its own port;
SIGTERM drains both and leaves no process."""

from __future__ import annotations

import os
import signal

import httpx

from mindmotor.runtime.proc_tree import descendants

from .processes import CoordinatorProcess, wait_until


def replica(port: str) -> dict:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()["replica"]
    except (httpx.HTTPError, ValueError, KeyError):
        return {}


def test_two_replicas_serve_one_port_and_one_killed_comes_back(virtual_workers, tiny_ckpt, model_name, tmp_path):
    group = CoordinatorProcess(tmp_path / "group.log", "--replicas", "2", "--model-dir", str(tiny_ckpt),
                               *(f"--worker={w.address}" for w in virtual_workers))
    try:
        ports = group.child.ready["replica_ports"].split(",")
        pids = [replica(p)["pid"] for p in ports]
        assert len(set(pids)) == 2 and all(pid in descendants(group.proc.pid) for pid in pids)
        body = {"model": model_name, "prompt": "x", "max_tokens": 2, "temperature": 0}
        wait_until(lambda: httpx.post(f"{group.url}/v1/completions", json=body, timeout=30).status_code == 200,
                   timeout=30, what="the group serving")
        seen = set()
        wait_until(lambda: seen.add(httpx.get(f"{group.url}/health", timeout=5).json()["replica"]["pid"])
                   or seen == set(pids), timeout=30, what="both replicas answering the one port")

        os.kill(pids[0], signal.SIGKILL)
        for _ in range(20):                              # the other replica answers meanwhile
            assert httpx.post(f"{group.url}/v1/completions", json=body, timeout=30).status_code == 200
        wait_until(lambda: replica(ports[0]).get("pid") not in (None, pids[0]), timeout=60,
                   what="the killed replica back on its own port")
        assert "mindmotor_coordinator_requests_total" in httpx.get(f"{group.url}/metrics", timeout=10).text
    finally:
        everything = descendants(group.proc.pid)
        group.child.signal(signal.SIGTERM)
        assert group.proc.wait(60) == 0
        wait_until(lambda: not [p for p in everything if os.path.exists(f"/proc/{p}")
                                and open(f"/proc/{p}/stat").read().split(") ")[1][0] != "Z"],
                   timeout=30, what="no replica or helper left")
