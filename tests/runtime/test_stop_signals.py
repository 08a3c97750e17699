"""A supervisor's stop signals: the first asks for an orderly stop, a second one forces (every child
killed, exit 128 + signal) — on a real `mindmotor coordinator --replicas 2`, and the handler alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from mindmotor.common.waiting import wait_until
from mindmotor.runtime.proc_tree import descendants, running
from mindmotor.runtime.stop_signals import StopSignals


def test_the_first_signal_requests_a_stop_the_second_forces_it():
    forced, exits = [], []
    signals = StopSignals(force=lambda: forced.append(1), exit_=exits.append)
    signals.handle(signal.SIGINT)
    assert signals.requested.is_set() and forced == [] and exits == []
    signals.handle(signal.SIGINT)
    assert forced == [1] and exits == [130]
    signals.handle(signal.SIGTERM)
    assert exits[-1] == 143


def test_it_exits_even_when_killing_fails():
    exits = []

    def broken():
        raise OSError("no such process")

    signals = StopSignals(force=broken, exit_=exits.append)
    signals.requested.set()
    with pytest.raises(OSError):
        signals.handle(signal.SIGINT)
    assert exits == [130]


@pytest.mark.timeout(120)
def test_ctrl_c_drains_coordinator_replicas_and_a_second_one_stops_them_at_once(tmp_path):
    """`coordinator --replicas 2` in a terminal (its own process group here; the replicas are not
    in it): Ctrl-C reaches the parent alone, which stops its replicas; one replica that cannot drain
    (SIGSTOPped) holds the stop up until a second Ctrl-C, which kills it and exits 130 at once."""
    log = open(tmp_path / "coordinator.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "mindmotor.cli", "coordinator", "--port", "0", "--replicas", "2",
                             "--worker", "127.0.0.1:1"], stdout=subprocess.PIPE, stderr=log, text=True,
                            start_new_session=True)      # its own "terminal" process group
    try:
        line = proc.stdout.readline()
        assert line.startswith("MINDMOTOR_COORDINATOR_READY"), (tmp_path / "coordinator.log").read_text()
        replicas = descendants(proc.pid)
        assert len(replicas) == 2
        assert all(os.getpgid(pid) != proc.pid for pid in replicas)   # not in the "terminal's" group
        stuck, free = replicas
        os.kill(stuck, signal.SIGSTOP)
        os.killpg(proc.pid, signal.SIGINT)
        wait_until(lambda: not running(free), timeout=30, what="the free replica to drain and exit")
        assert running(stuck) and proc.poll() is None              # the stop waits for the stuck one
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(30) == 130
        wait_until(lambda: not running(stuck), timeout=10, what="the stuck replica to be killed")
    finally:
        proc.kill()
        proc.wait()
        log.close()
