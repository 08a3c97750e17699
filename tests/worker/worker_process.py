"""What the worker tests start: the suite's `WorkerProcess` / `start_worker`
(tests/support/service_processes.py), here with the worker tests' realtime flags."""

from __future__ import annotations

from mindmotor.common.waiting import wait_until
from service_processes import WorkerProcess, start_worker

__all__ = ["REALTIME_ARGS", "WorkerProcess", "start_worker", "wait_until"]

# A realtime worker sized and timed like Qwen2-7B on a 910B3: ~16 ms per decode step, so a
# stream of 100+ tokens lasts long enough to cancel, abort or drain in the middle of it.
REALTIME_ARGS = ("--timing", "realtime", "--emulate", "qwen2-7b")
