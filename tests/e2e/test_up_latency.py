"""`mindmotor analyze latency` finds a known cause: `mindmotor up` (one virtual-timing worker) whose
worker waits 150 ms before its engine gets each request (`--inject-delay worker_queue=0.15`, a
test-only worker flag, given through the model's `extra_args`), under a load of concurrent
requests; the analysis of the running platform names the worker's queue as the top phase, with
the injected time in it."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import yaml

from mindmotor.cli import main
from mindmotor.runtime.child_process import ChildProcess

DELAY_S = 0.15
REQUESTS = 24


def test_analyze_latency_names_the_phase_a_delay_was_injected_into(e2e_model, tmp_path, capsys):
    config = tmp_path / "up.yaml"
    config.write_text(yaml.safe_dump({
        "port": 0, "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "logs"),
        "models": [{"path": str(e2e_model), "timing": "virtual", "workers": 1,
                    "extra_args": ["--inject-delay", f"worker_queue={DELAY_S}"]}]}))
    up = ChildProcess("up", ["up", "--config", str(config)], "MINDMOTOR_UP_READY", tmp_path / "up.log")
    try:
        url = up.wait_ready(180)["url"]
        body = {"model": e2e_model.name, "max_tokens": 4, "ignore_eos": True}
        with httpx.Client(base_url=url, timeout=60) as http, ThreadPoolExecutor(8) as pool:
            for r in pool.map(lambda i: http.post("/v1/completions", json={**body, "prompt": f"request {i}"}),
                              range(REQUESTS)):
                assert r.status_code == 200, r.text
        capsys.readouterr()
        assert main(["analyze", "latency", "--url", url, "--json"]) == 0
        (row,) = json.loads(capsys.readouterr().out)
        assert main(["analyze", "latency", "--url", url]) == 0           # the table an operator reads
        table = capsys.readouterr().out
    finally:
        assert up.stop(60) == 0
    assert row["model"] == e2e_model.name and row["requests"] == REQUESTS
    assert row["top_phase"] == "worker_queue", row
    queue = next(p for p in row["phases"] if p["phase"] == "worker_queue")
    assert queue["mean_s"] >= DELAY_S, row
    assert "top: worker_queue" in table
