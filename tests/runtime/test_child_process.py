"""`ChildProcess` starts children without fork() (vfork + exec through the exec wrapper), so a
parent with gRPC threads running is never forked; the children still die with their parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from mindmotor.common.waiting import wait_until
from mindmotor.runtime.child_command import WRAPPER
from mindmotor.runtime.child_process import ChildProcess
from mindmotor.runtime.proc_tree import running

READY = "CHILD_READY"
REPORT = ("import ctypes, os, time; c = ctypes.c_int(); "
          "ctypes.CDLL('libc.so.6').prctl(2, ctypes.byref(c)); "        # 2 = PR_GET_PDEATHSIG
          f"print('{READY}', f'pdeathsig={{c.value}}', f'ppid={{os.getppid()}}', f'pgid={{os.getpgid(0)}}', "
          "f'pid={os.getpid()}', flush=True); time.sleep(60)")


def test_children_start_without_forking_a_process_that_has_grpc_threads(tmp_path):
    forks = []
    os.register_at_fork(before=lambda: forks.append(1))      # runs on fork() (and preexec_fn), not vfork
    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    children = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=10)          # gRPC threads are running
            children = [ChildProcess(f"c{i}", ["-c", REPORT], READY, tmp_path / f"c{i}.log",
                                     program=[sys.executable]) for i in range(3)]
        for child in children:
            ready = child.wait_ready(30)
            assert ready["pdeathsig"] == str(int(signal.SIGTERM))    # set by the wrapper, kept across exec
            assert ready["ppid"] == str(os.getpid())                 # the wrapper exec'd: no process between
            # a process group of its own: a terminal's Ctrl-C reaches the supervisor, not the children
            assert ready["pgid"] == ready["pid"] != str(os.getpgid(0))
        assert forks == []
    finally:
        for child in children:
            child.kill()
        server.stop(0)


def test_the_wrapper_does_not_start_a_program_whose_parent_is_gone():
    """Its parent died between the start and the prctl: the program would be an orphan."""
    not_the_parent = os.getpid() + 1_000_000
    done = subprocess.run([sys.executable, "-I", "-S", str(WRAPPER), str(not_the_parent), "15",
                           sys.executable, "-c", "print('ran')"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 125 and "ran" not in done.stdout


def test_a_grandchild_gets_sigterm_when_its_parent_is_killed(tmp_path):
    code = ("import sys, time; from pathlib import Path; from mindmotor.runtime.child_process import ChildProcess; "
            f"c = ChildProcess('g', ['-c', {REPORT!r}], {READY!r}, Path({str(tmp_path / 'g.log')!r}), "
            "program=[sys.executable]); c.wait_ready(30); "
            "print('PARENT_READY', f'child={c.proc.pid}', flush=True); time.sleep(60)")
    parent = ChildProcess("parent", ["-c", code], "PARENT_READY", tmp_path / "parent.log", program=[sys.executable])
    try:
        grandchild = int(parent.wait_ready(60)["child"])
        parent.kill()                                                # SIGKILL: it cleans nothing up
        wait_until(lambda: not running(grandchild), timeout=30, what="the grandchild to exit")
    finally:
        parent.kill()


def test_a_none_in_env_removes_an_inherited_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("MINDMOTOR_ADMIN_TOKEN", "inherited")
    child = ChildProcess("env", ["-c", "import os; print('ENV_READY', 'token=' + os.environ.get("
                                       "'MINDMOTOR_ADMIN_TOKEN', '-'), 'x=' + os.environ['X'], flush=True)"],
                         "ENV_READY", tmp_path / "env.log", env={"MINDMOTOR_ADMIN_TOKEN": None, "X": "1"},
                         program=[sys.executable])
    assert child.wait_ready(30) == {"token": "-", "x": "1"}
    child.kill()
