"""`mindmotor up` keeps its state in one directory: a restart on it comes back with the same CA, the
same ports and the deployments as they were left (a promoted version stays promoted); a second
`up` on it is refused; `MINDMOTOR_API_KEYS` is honored; `mindmotor deploy` finds the running one there without any TLS flag; nothing
temporary is left behind."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import httpx

from mindmotor.runtime.child_process import ChildProcess

API_KEY = "k-state-test"
UP = ["up", "--port", "0", "--timing", "virtual", "--workers", "1"]


def _up(e2e_model, state, log) -> ChildProcess:
    up = ChildProcess("up", [*UP, "--model", str(e2e_model), "--state-dir", str(state)], "MINDMOTOR_UP_READY", log,
                      env={"MINDMOTOR_API_KEYS": API_KEY, "MINDMOTOR_COORDINATORS": "1"})
    up.wait_ready(180)
    return up


def _deploy(state, *args: str) -> subprocess.CompletedProcess:
    """`mindmotor deploy ...` as an operator types it: no --deployer, no TLS flag, no TLS variable."""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("MINDMOTOR_TLS_")}
    env["MINDMOTOR_STATE_DIR"] = str(state)
    return subprocess.run([sys.executable, "-m", "mindmotor.cli", "deploy", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def _ca_fingerprint(state) -> str:
    return hashlib.sha256((state / "pki" / "ca.pem").read_bytes()).hexdigest()


def test_a_restart_keeps_ca_ports_and_the_promoted_version_and_a_second_up_is_refused(e2e_model, tmp_path):
    state = tmp_path / "state"
    up = _up(e2e_model, state, tmp_path / "up-1.log")
    try:
        first, fingerprint = dict(up.ready), _ca_fingerprint(state)
        info = json.loads((state / "up.json").read_text())
        assert info["url"] == first["url"] and info["tls"]["ca"] == str(state / "pki" / "ca.pem")

        # `MINDMOTOR_API_KEYS=k mindmotor up`: the API wants the key
        body = {"model": e2e_model.name, "prompt": "x", "max_tokens": 2}
        assert httpx.post(f"{first['url']}/v1/completions", json=body, timeout=30).status_code == 401
        assert httpx.post(f"{first['url']}/v1/completions", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200

        # a second up on the same directory: one line saying who holds it, exit 3, nothing started
        second = subprocess.run([sys.executable, "-m", "mindmotor.cli", *UP, "--model", str(e2e_model),
                                 "--state-dir", str(state)], capture_output=True, text=True, timeout=60)
        assert second.returncode == 3, second.stderr
        (line,) = second.stderr.strip().splitlines()
        assert f"pid {up.proc.pid}" in line and str(state) in line and first["url"] in line

        # canary v2 and promote it, through the state directory alone
        name = e2e_model.name
        rollout = _deploy(state, "rollout", name, "--version", "v2", "--checkpoint", str(e2e_model),
                          "--canary", "50", "--no-analysis")
        assert rollout.returncode == 0, rollout.stderr
        promoted = _deploy(state, "promote", name, "--json")
        assert promoted.returncode == 0, promoted.stderr
        assert json.loads(promoted.stdout)["spec"]["traffic"] == {"v2": 100.0}
    finally:
        up.stop(60)
    assert up.proc.returncode == 0
    assert not (state / "up.json").exists() and not (state / "run").exists()

    up = _up(e2e_model, state, tmp_path / "up-2.log")
    try:
        again = dict(up.ready)
        for key in ("port", "controller_port", "controller_admin_port", "deployer_port", "deployer_metrics_port",
                    "metrics_port", "coordinator_ports"):
            assert again[key] == first[key], key
        assert _ca_fingerprint(state) == fingerprint
        got = _deploy(state, "get", name, "--json")
        assert got.returncode == 0, got.stderr
        deployment = json.loads(got.stdout)
        assert deployment["spec"]["traffic"] == {"v2": 100.0}
        assert [v["name"] for v in deployment["spec"]["versions"]] == ["v2"]
    finally:
        up.stop(60)
    assert up.proc.returncode == 0
