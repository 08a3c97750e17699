"""`mindmotor coordinator` as a real process: flags, the ready line, JSON logs with request ids,
a clean stop on SIGTERM, a clear failure on bad settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx

from secrets_registry import given_secret
from .processes import CoordinatorProcess

API_KEY = given_secret("sk-cli-key")


def test_cli_serves_logs_json_with_request_ids_and_stops_on_sigterm(virtual_workers, tiny_ckpt, model_name, tmp_path):
    c = CoordinatorProcess(tmp_path / "coordinator.log", "--worker", virtual_workers[0].address,
                           "--worker", f"{virtual_workers[1].address},weight=2", "--model-dir", str(tiny_ckpt),
                           "--policy", "weighted_round_robin", "--api-key", API_KEY, "--max-requests", "50",
                           "--access-log")
    try:
        with httpx.Client(base_url=c.url, timeout=30, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            assert http.get("/health").status_code == 200
            r = http.post("/v1/chat/completions", headers={"X-Request-Id": "cli-req-1"}, json={
                "model": model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
            assert r.status_code == 200 and r.json()["id"] == "chatcmpl-cli-req-1"
            assert http.post("/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
        c.proc.terminate()
        assert c.proc.wait(timeout=15) == 0
        lines = [json.loads(line) for line in c.log_text().splitlines() if line.startswith("{")]
        assert lines and all(line["service"] == "coordinator" for line in lines)
        tagged = [line for line in lines if line.get("request_id") == "cli-req-1"]
        assert any(line["msg"] == "request" and line["status"] == 200 for line in tagged)
        access = [(line["path"], line["status"]) for line in lines if line["msg"] == "request"]
        assert ("/v1/models", 401) in access          # refusals are logged too
        assert not any(path == "/health" for path, _ in access)   # a probe that succeeds is DEBUG
    finally:
        c.stop()


def test_cli_bad_settings_exit_2_with_a_message(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mindmotor.cli", "coordinator", "--port", "0",
                          "--model-dir", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "not a checkpoint directory" in out.stderr
    assert "MINDMOTOR_COORDINATOR_READY" not in out.stdout


def test_cli_without_models_or_workers_exits_2_naming_both():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDMOTOR_")}
    out = subprocess.run([sys.executable, "-m", "mindmotor.cli", "coordinator", "--port", "0"],
                         capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode == 2
    assert "nothing to serve" in out.stderr and "--controller" in out.stderr and "--model" in out.stderr
