"""End-to-end fixtures: real service processes on free ports, stopped at teardown."""

from __future__ import annotations

import pytest

from mindmotor.common.waiting import wait_until  # noqa: F401 (re-exported to the tests)
from mindmotor.model.testing import write_tiny_checkpoint
from mindmotor.runtime.child_process import ChildProcess


@pytest.fixture(scope="session")
def e2e_model(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("e2e-model"))


@pytest.fixture
def spawn(tmp_path):
    """spawn(name, args, ready_prefix) → a ready ChildProcess; all are killed at teardown."""
    children: list[ChildProcess] = []

    def start(name: str, args: list[str], ready_prefix: str, timeout_s: float = 60.0) -> ChildProcess:
        child = ChildProcess(name, args, ready_prefix, tmp_path / f"{name}.log")
        children.append(child)
        child.wait_ready(timeout_s)
        return child

    yield start
    for child in children:
        child.kill()
