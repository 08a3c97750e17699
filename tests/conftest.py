"""Fixtures shared across the suite: small real checkpoints written once per session; and the
suite-wide secret grep — at the end of the session every log file the suite produced (under
pytest's base temporary directory, and the /tmp/mindmotor-up-* and /tmp/mindmotor-deployer-*
directories made during the session) is searched for every secret registered through
tests/support/secrets_registry.py and for every private key found there; a hit fails the session."""

from __future__ import annotations

import glob
import time
from pathlib import Path

import pytest

import secrets_registry
from mindmotor.model.testing import write_tiny_checkpoint

DEFAULT_LOG_DIR_PATTERNS = ("/tmp/mindmotor-up-*", "/tmp/mindmotor-deployer-*")
_session_started = time.time()


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """A 2-layer GQA Llama with random weights and a trained 384-token BPE tokenizer."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny_qwen2_ckpt(tmp_path_factory):
    """The same shape as Qwen2: q/k/v bias, tied embeddings."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen2"), architecture="Qwen2ForCausalLM",
                                 attention_bias=True, tie_word_embeddings=True, seed=1)


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
    roots = _log_roots(session.config)
    for root in roots:
        for key in secrets_registry.private_keys_under(root):
            secrets_registry.given_private_key(key)
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
