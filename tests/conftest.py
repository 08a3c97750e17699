"""Fixtures shared across the suite: small real checkpoints written once per session; real
controllers (`spawn_controller`, tests/support/service_processes.py); a Redis key prefix of the
test's own (`redis_prefix`); and the suite-wide secret grep — at the end of the session every log file the suite produced (under
pytest's base temporary directory, and the /tmp/mindmotor-up-* and /tmp/mindmotor-deployer-*
directories made during the session) is searched (under pytest-xdist, by the controller's session, for
the secrets every worker registered) for every secret registered through
tests/support/secrets_registry.py and for every private key found there; a hit fails the session."""

from __future__ import annotations

import glob
import time
import uuid
from pathlib import Path

import pytest

import secrets_registry
from mindmotor.model.testing import write_tiny_checkpoint
from service_processes import FAST_CONTROLLER, REDIS_URL, ControllerProcess

DEFAULT_LOG_DIR_PATTERNS = ("/tmp/mindmotor-up-*", "/tmp/mindmotor-deployer-*")
_session_started = time.time()


@pytest.fixture(scope="session", autouse=True)
def _no_state_in_the_home_directory(tmp_path_factory):
    """A `mindmotor up` that a test starts without --state-dir keeps its state under the session's
    temporary directory, never in the user's ~/.local/share/mindmotor (common/up_state.py)."""
    import os

    previous = os.environ.get("XDG_DATA_HOME")
    os.environ["XDG_DATA_HOME"] = str(tmp_path_factory.mktemp("xdg-data"))
    os.environ.pop("MINDMOTOR_STATE_DIR", None)
    yield
    if previous is None:
        os.environ.pop("XDG_DATA_HOME", None)
    else:
        os.environ["XDG_DATA_HOME"] = previous


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """A 2-layer GQA Llama with random weights and a trained 384-token BPE tokenizer."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny_qwen2_ckpt(tmp_path_factory):
    """The same shape as Qwen2: q/k/v bias, tied embeddings."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen2"), architecture="Qwen2ForCausalLM",
                                 attention_bias=True, tie_word_embeddings=True, seed=1)


@pytest.fixture
def spawn_controller(tmp_path):
    """spawn_controller(*args, fast=True, extra=None, port=0, admin_token=None, redis_prefix=None,
    redis_url=None) -> a ready `ControllerProcess`, killed at teardown. `fast`: the short timings of
    `FAST_CONTROLLER`; `extra`: more flags ({"--flag": "value"}, None for a flag without a value)."""
    started: list[ControllerProcess] = []

    def spawn(*args: str, fast: bool = True, extra: dict[str, str | None] | None = None,
              **kwargs) -> ControllerProcess:
        flags = {**(FAST_CONTROLLER if fast else {}), **(extra or {})}
        process = ControllerProcess(tmp_path / f"controller-{len(started)}.log", *args, flags=flags, **kwargs)
        started.append(process)
        return process.wait_ready()

    yield spawn
    for process in started:
        process.kill()


@pytest.fixture
def redis_prefix():
    """A fresh key prefix in the test Redis (`REDIS_URL`); every key under it is deleted afterwards.
    Fails (not skips) without a Redis: .ci/run starts one."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5)
    try:
        client.ping()
    except redis.RedisError:
        pytest.fail(f"no Redis at {REDIS_URL}: these tests need a real Redis (.ci/run starts one)")
    prefix = f"mmtest:{uuid.uuid4().hex[:10]}:"
    yield prefix
    for key in client.scan_iter(match=prefix + "*"):
        client.delete(key)
    client.close()


def pytest_sessionstart(session):
    global _session_started
    _session_started = time.time()


def _log_roots(config) -> list[Path]:
    roots = []
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is not None and getattr(factory, "_basetemp", None) is not None:
        roots.append(Path(factory._basetemp))        # only if this session made one
    for pattern in DEFAULT_LOG_DIR_PATTERNS:
        for name in glob.glob(pattern):
            path = Path(name)
            try:
                if path.is_dir() and path.stat().st_mtime >= _session_started - 1:
                    roots.append(path)
            except OSError:
                continue
    return roots


def pytest_sessionfinish(session, exitstatus):
    worker = getattr(session.config, "workerinput", None)
    if worker is not None:
        # a pytest-xdist worker: its session's status is not the run's, so it hands the secrets
        # its tests gave to the controller (next to the worker's own temporary directory, under
        # the controller's), whose session greps every worker's logs for all of them
        basetemp = Path(session.config._tmp_path_factory.getbasetemp())
        secrets_registry.hand_over(basetemp.parent / f"secrets-{worker['workerid']}.txt")
        return
    roots = _log_roots(session.config)
    for root in roots:
        for key in secrets_registry.private_keys_under(root):
            secrets_registry.given_private_key(key)
        secrets_registry.take_over(root)
    files = [path for root in roots for path in secrets_registry.log_files_under(root)]
    leaks = secrets_registry.find_leaks(files, secrets_registry.registered())
    if not leaks:
        return
    lines = "\n".join(f"  {path}:{number}" for path, number in leaks[:50])
    more = f"\n  ... and {len(leaks) - 50} more" if len(leaks) > 50 else ""
    session.config.get_terminal_writer().line(
        f"\nSECRET LEAK: {len(leaks)} line(s) of the suite's logs hold a secret the tests gave a service "
        f"(the secret itself is not printed):\n{lines}{more}", red=True, bold=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
