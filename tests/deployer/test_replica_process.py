"""A local replica's process, as the deployer sees it (runtime/detached_process.py): started
through the exec wrapper's `--detach` mode it is the child of the anchor (a child subreaper), not
of whoever started it; another process recognises it by pid + start time + command line (and a
pid with another start time or command line is not it); it dies when the anchor dies. Its
environment is the allow-list (worker_env.py): the deployer's secrets never reach it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from secrets_registry import given_secret
from mindmotor.common.waiting import wait_until
from mindmotor.deployer.backends.worker_env import worker_environment
from mindmotor.runtime.detached_process import DetachedProcess, proc_start_time

# The anchor: a child subreaper that starts one detached "replica" (it prints a ready line and
# sleeps), prints the replica's record and its own parent's view, then waits to be killed.
ANCHOR = """
import json, os, sys, time
from pathlib import Path
from mindmotor.deployer.backends.worker_env import worker_environment
from mindmotor.runtime.detached_process import DetachedProcess
from mindmotor.runtime.subreaper import become_subreaper
assert become_subreaper()
out = Path(sys.argv[1])
program = [sys.executable, "-c", "import time; print('REPLICA_READY port=123', flush=True); time.sleep(120)",
           "--worker-id", "demo-v1-0"]
env = worker_environment({k: v for k, v in os.environ.items() if k == "PYTHONPATH"})
proc = DetachedProcess.spawn(program, out / "replica.log", out / "replica.out", os.getpid(), env,
                             cmdline_mark="--worker-id\\0demo-v1-0")
while proc.poll_ready("REPLICA_READY") is None:
    time.sleep(0.02)
print(json.dumps({"record": proc.to_dict(), "ready": proc.poll_ready("REPLICA_READY")}), flush=True)
time.sleep(120)
"""


def ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_detached_replica_is_the_anchors_is_recognised_by_others_and_dies_with_the_anchor(tmp_path):
    env = {**os.environ, "MINDMOTOR_ADMIN_TOKEN": given_secret("secret-admin-token"), "MINDMOTOR_REDIS_URL": "redis://x:6379/0"}
    anchor = subprocess.Popen([sys.executable, "-c", ANCHOR, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        line = anchor.stdout.readline()
        assert line, "the anchor printed nothing"
        started = json.loads(line)
        record, pid = started["record"], started["record"]["pid"]
        assert started["ready"] == {"port": "123"}
        assert ppid(pid) == anchor.pid                       # the anchor's child, though the wrapper started it

        adopted = DetachedProcess.adopt(record)              # from here: not its parent
        assert adopted is not None and adopted.alive() and adopted.poll_ready("REPLICA_READY") == {"port": "123"}
        assert DetachedProcess.adopt({**record, "start_time": record["start_time"] + 1}) is None   # a reused pid
        assert DetachedProcess.adopt({**record, "cmdline_mark": "--worker-id\0other-v1-0"}) is None
        assert DetachedProcess.adopt({"pid": "x"}) is None

        environ = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
        names = {item.split("=", 1)[0] for item in environ if item}
        assert "secret-admin-token" not in "\0".join(environ)
        assert not names & {"MINDMOTOR_ADMIN_TOKEN", "MINDMOTOR_REDIS_URL"} and "PATH" in names
        assert ("PYTHONPATH" in names) == ("PYTHONPATH" in os.environ)      # kept when there is one

        anchor.kill()                                       # the anchor dies: so does the replica
        anchor.wait()
        wait_until(lambda: proc_start_time(pid) is None, timeout=10, interval=0.05, what="the replica gone")
        assert not adopted.alive()
    finally:
        if anchor.poll() is None:
            anchor.kill()
            anchor.wait()


def test_the_worker_environment_is_an_allow_list():
    source = {"PATH": "/bin", "HOME": "/h", "LC_ALL": "C", "MINDMOTOR_ADMIN_TOKEN": "t", "MINDMOTOR_REDIS_URL": "r",
              "MINDMOTOR_API_KEYS": "k", "AWS_SECRET_ACCESS_KEY": "a", "MINDMOTOR_TLS_CERT": "/c.pem",
              "GRPC_VERBOSITY": "error", "GRPC_ENABLE_FORK_SUPPORT": "true", "OPENBLAS_CORETYPE": "Haswell"}
    env = worker_environment({"MINDMOTOR_TLS_KEY": "/k.pem", "HOME": None}, source=source)
    assert env == {"PATH": "/bin", "LC_ALL": "C", "MINDMOTOR_TLS_CERT": "/c.pem", "MINDMOTOR_TLS_KEY": "/k.pem",
                   "GRPC_VERBOSITY": "error", "GRPC_ENABLE_FORK_SUPPORT": "false", "PYTHONUNBUFFERED": "1",
                   "OPENBLAS_CORETYPE": "Haswell"}
