"""Fixtures of the coordinator's tests: real workers (subprocesses on the tiny checkpoint) and
coordinators (in-process on a free port, or subprocesses), all stopped at teardown.

The tiny checkpoint is `tiny_ckpt` from the suite's conftest; its served name is its directory's
name (the workers report it in Status)."""

from __future__ import annotations

import pytest

from .processes import REALTIME_ARGS, InProcessCoordinator, start_workers


@pytest.fixture(scope="session")
def model_name(tiny_ckpt):
    return tiny_ckpt.name


@pytest.fixture(scope="session")
def virtual_workers(tiny_ckpt, tmp_path_factory):
    """Two shared virtual-timing workers; tests must leave them serving."""
    workers = start_workers(tiny_ckpt, tmp_path_factory.mktemp("worker-logs"), 2, "--timing", "virtual")
    yield workers
    for w in workers:
        w.stop()


@pytest.fixture(scope="session")
def realtime_worker(tiny_ckpt, tmp_path_factory):
    """A shared realtime worker (~15 ms per step) for requests that must last; leave it serving."""
    (worker,) = start_workers(tiny_ckpt, tmp_path_factory.mktemp("rt-worker-logs"), 1, *REALTIME_ARGS)
    yield worker
    worker.stop()


@pytest.fixture(scope="session")
def coordinator(virtual_workers, tiny_ckpt):
    """The shared coordinator over both virtual workers (least_load, no auth)."""
    c = InProcessCoordinator(workers=[w.address for w in virtual_workers], model_dir=str(tiny_ckpt))
    yield c
    c.stop()


@pytest.fixture
def make_coordinator(tiny_ckpt):
    """More coordinators, with settings of the test's own; stopped at teardown."""
    started = []

    def make(**settings) -> InProcessCoordinator:
        settings.setdefault("model_dir", str(tiny_ckpt))
        c = InProcessCoordinator(**settings)
        started.append(c)
        return c

    yield make
    for c in started:
        c.stop()
