"""Workers as real processes on real sockets, built on one tiny random-weight checkpoint."""

from __future__ import annotations

import pytest

from mindmotor.model.testing import write_tiny_checkpoint

from .worker_process import REALTIME_ARGS, WorkerProcess, start_worker as start_worker_process


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def start_worker(tiny_model, tmp_path):
    """Start a worker of one's own (for tests that stop it); stopped at teardown."""
    started = []

    def start(*extra_args: str) -> WorkerProcess:
        worker = WorkerProcess(tiny_model, tmp_path / f"worker-{len(started)}.log", *extra_args)
        started.append(worker)
        return worker.wait_ready()

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture(scope="session")
def worker(tiny_model, tmp_path_factory):
    """The shared virtual-timing worker; tests must leave it serving."""
    w = start_worker_process(tiny_model, tmp_path_factory.mktemp("logs") / "worker.log", "--timing", "virtual")
    yield w
    w.stop()


@pytest.fixture(scope="session")
def realtime_worker(tiny_model, tmp_path_factory):
    """A shared realtime worker for mid-stream cancel/abort; tests must leave it serving."""
    w = start_worker_process(tiny_model, tmp_path_factory.mktemp("logs") / "realtime-worker.log", *REALTIME_ARGS)
    yield w
    w.stop()
