"""runtime/subreaper.py: the zombies a supervisor collects are found from its own children list (not
a scan of every process), its own children and adopted orphans alike; `keep` is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from mindmotor.runtime.subreaper import child_pids, reap_orphans, zombie_children


def _until(predicate, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


def test_children_and_zombies_of_this_process():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    quitter = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        assert {sleeper.pid, quitter.pid} <= set(child_pids() or [sleeper.pid, quitter.pid])
        _until(lambda: quitter.pid in zombie_children())
        assert sleeper.pid not in zombie_children()
        assert reap_orphans(keep={quitter.pid}) == []               # kept: subprocess collects it
        assert quitter.wait(10) == 0
        assert quitter.pid not in zombie_children()
    finally:
        sleeper.kill()
        sleeper.wait()


ADOPTER = r"""
import os, subprocess, sys, time
from mindmotor.runtime.subreaper import become_subreaper, reap_orphans
assert become_subreaper()
# a child that starts a grandchild and exits at once: the grandchild is handed to this process
middle = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(0.3)']); print(p.pid)"],
    stdout=subprocess.PIPE, text=True)
grandchild = int(middle.stdout.readline())
middle.wait()
deadline = time.monotonic() + 20
reaped = []
while time.monotonic() < deadline and not reaped:
    reaped = reap_orphans(keep=set())
    time.sleep(0.02)
print(grandchild, reaped)
"""


def test_an_adopted_orphan_is_reaped():
    out = subprocess.run([sys.executable, "-c", ADOPTER], capture_output=True, text=True, timeout=60,
                         env={**os.environ})
    assert out.returncode == 0, out.stderr
    grandchild, reaped = out.stdout.split(" ", 1)
    assert reaped.strip() == f"[({grandchild}, 0)]"
