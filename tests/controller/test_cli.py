"""`mindmotor controller` as a command: flags, fail-fast errors, the ready line, SIGTERM."""

from __future__ import annotations

import subprocess
import sys

from mindmotor.cli import build_parser
from mindmotor.common.ports import free_port
from mindmotor.controller.cli import config_from_args


def run(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mindmotor.cli", "controller", "--port", "0",
                           "--admin-port", "0", "--host", "127.0.0.1", "--admin-host", "127.0.0.1", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_flags_and_environment(monkeypatch):
    monkeypatch.setenv("MINDMOTOR_REDIS_URL", "redis://example:6379/2")
    monkeypatch.setenv("MINDMOTOR_ADMIN_TOKEN", "tok")
    args = build_parser().parse_args(["controller", "--port", "0", "--admin-port", "9", "--dead-after", "4",
                                      "--heartbeat-interval", "0.5", "--lease-ttl", "3", "--redis-prefix", "x:"])
    config = config_from_args(args)
    assert (config.port, config.admin_port, config.dead_after_s, config.heartbeat_interval_s) == (0, 9, 4.0, 0.5)
    assert (config.redis_url, config.redis_prefix, config.admin_token, config.lease_ttl_s) == \
        ("redis://example:6379/2", "x:", "tok", 3.0)
    assert config.suspect_after_s == 1.5 and config.store_kind == "redis"


def test_inconsistent_timeouts_fail_fast():
    result = run("--heartbeat-interval", "1", "--dead-after", "2")     # suspect (3 s) after dead (2 s)
    assert result.returncode == 1 and "dead-after" in result.stderr and "READY" not in result.stdout


def test_unreachable_redis_fails_fast():
    result = run("--redis-url", f"redis://127.0.0.1:{free_port()}/0")
    assert result.returncode == 1 and "redis" in result.stderr.lower() and "READY" not in result.stdout


def test_ready_line_and_sigterm(spawn_controller):
    ctrl = spawn_controller()
    assert ctrl.port > 0 and ctrl.admin_port > 0
    assert ctrl.terminate() == 0
    assert '"controller stopped"' in ctrl.log_path.read_text()
