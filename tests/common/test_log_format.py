"""Logs a person reads on a terminal, JSON lines everywhere else (`--log-format`,
`$MINDMOTOR_LOG_FORMAT`): the choice, both formats' content, no terminal escapes in JSON, secrets
masked in either, and a real command's stderr on a pseudo-terminal and on a pipe."""

from __future__ import annotations

import io
import json
import logging
import os
import pty
import subprocess
import sys

import pytest

from mindmotor.common.logging import request_context, resolve_log_format, setup_logging
from mindmotor.common.redact import register_secret


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def restore_root_logger():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


@pytest.mark.parametrize("given, env, stream, expected", [
    (None, None, Terminal(), "text"), (None, None, io.StringIO(), "json"),
    ("json", None, Terminal(), "json"), ("text", None, io.StringIO(), "text"),
    (None, "json", Terminal(), "json"), (None, "auto", Terminal(), "text"), ("json", "text", Terminal(), "json")])
def test_the_format_is_the_flag_then_the_environment_then_the_stream(monkeypatch, given, env, stream, expected):
    monkeypatch.delenv("MINDMOTOR_LOG_FORMAT", raising=False)
    if env is not None:
        monkeypatch.setenv("MINDMOTOR_LOG_FORMAT", env)
    assert resolve_log_format(given, stream) == expected


def test_an_unknown_format_is_refused(monkeypatch):
    monkeypatch.setenv("MINDMOTOR_LOG_FORMAT", "yaml")
    with pytest.raises(ValueError, match="'yaml' is not one of auto, json, text"):
        resolve_log_format(None, io.StringIO())


def test_text_lines_carry_the_fields_and_mask_secrets(restore_root_logger, monkeypatch):
    monkeypatch.delenv("MINDMOTOR_LOG_FORMAT", raising=False)
    secret = "sk-log-format-0123456789"
    register_secret(secret)
    stream = Terminal()
    setup_logging("up", "INFO", stream=stream)
    with request_context("req-1"):
        logging.getLogger("mindmotor.test").info("serving", extra={"url": "http://x", "note": "two words",
                                                                 "key": secret})
    line = stream.getvalue().rstrip("\n")
    assert "\n" not in line and not line.startswith("{")
    assert " INFO    up: serving  request_id=req-1 url=http://x note=\"two words\" key=" in line
    assert secret not in line


def test_json_lines_hold_no_terminal_escapes(restore_root_logger, monkeypatch):
    stream = io.StringIO()
    setup_logging("svc", "INFO", stream=stream, log_format="json")
    uvicorn_log = logging.getLogger("uvicorn.error")
    # an in-process uvicorn run earlier in this process (a coordinator test) set its own level
    monkeypatch.setattr(uvicorn_log, "level", logging.NOTSET)
    monkeypatch.setattr(uvicorn_log, "propagate", True)
    uvicorn_log.info("\x1b[32mINFO\x1b[0m:     started \x1b[1mserver\x1b[0m")
    assert json.loads(stream.getvalue())["msg"] == "INFO:     started server"


def _stderr_of_a_failing_command(extra_args: list[str], on_terminal: bool) -> str:
    """`mindmotor coordinator` with settings it refuses (it logs one error and exits 2)."""
    args = [sys.executable, "-m", "mindmotor.cli", "coordinator", "--port", "-1", *extra_args]
    env = {k: v for k, v in os.environ.items() if k != "MINDMOTOR_LOG_FORMAT"}
    if not on_terminal:
        done = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 2
        return done.stderr
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=terminal, env=env)
        os.close(terminal)
        chunks = []
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:              # EIO: the process closed its end
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(60) == 2
        return b"".join(chunks).decode()
    finally:
        os.close(controller)


def test_a_command_on_a_terminal_writes_text_and_on_a_pipe_json():
    on_terminal = _stderr_of_a_failing_command([], on_terminal=True)
    assert "ERROR   coordinator: bad coordinator settings" in on_terminal and "{" not in on_terminal.split(":")[0]
    on_pipe = _stderr_of_a_failing_command([], on_terminal=False)
    assert json.loads(on_pipe.strip().splitlines()[-1])["msg"] == "bad coordinator settings"
    forced = _stderr_of_a_failing_command(["--log-format", "json"], on_terminal=True)
    assert json.loads(forced.strip().splitlines()[-1])["level"] == "ERROR"
