"""`HelperPool`: a few helper processes (helper.py) that run tasks for an asyncio service.

    pool = HelperPool("specs", size=2, task_timeout_s=5)
    await pool.start()                    # optional: else the first `run` starts the helpers
    result = await pool.run("compile_constraint", kind="json", spec="{...}", param="response_format")
    await pool.close()

Each helper runs one task at a time; a call waits for an idle one at most `wait_timeout_s`
(`HelperBusy`). A task that takes longer than `task_timeout_s` gets its helper SIGKILLed
(`HelperTimeout`); a helper that dies during a task (a native crash, the memory cap) fails that
call alone (`HelperCrashed`, with the signal); a call cancelled mid-task (its client went away)
kills its helper too, since the helper cannot be given other work before it answers. Every helper
that dies is replaced at once in the background (after a backoff if replacements keep dying at
start). Input the task refuses comes back as the task's `InvalidRequest`.

Helpers are started through the exec wrapper (`runtime/die_with_parent.py`) with SIGKILL as their
parent-death signal: they die with the serving process, even when it is SIGKILLed, and are
started with vfork + exec (no fork of a process that runs gRPC threads).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mindmotor.rules.request_rules import InvalidRequest
from mindmotor.runtime.child_command import child_command
from mindmotor.vocabulary import HelperOutcome

from . import wire

log = logging.getLogger("mindmotor.sandbox")

START_TIMEOUT_S = 30.0
BACKOFF_MAX_S = 10.0


class HelperFailure(Exception):
    """The task got no verdict: `HelperBusy`, `HelperTimeout`, `HelperCrashed`, `HelperError`."""
    outcome = HelperOutcome.FAILED


class HelperBusy(HelperFailure):
    outcome = HelperOutcome.BUSY


class HelperTimeout(HelperFailure):
    outcome = HelperOutcome.TIMEOUT


class HelperCrashed(HelperFailure):
    outcome = HelperOutcome.CRASHED

    def __init__(self, message: str, returncode: int | None):
        super().__init__(message)
        self.returncode = returncode


class HelperError(HelperFailure):
    """The task itself failed (a bug, not the input): the helper is kept."""
    outcome = HelperOutcome.ERROR


class HelperMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = registry if registry is not None else CollectorRegistry()
        self.tasks = Counter("mindmotor_helper_tasks", "Tasks run by helper processes, by outcome: ok, refused "
                             "(the input is bad), crashed, timeout, busy (no idle helper in time), error",
                             ["pool", "task", "outcome"], registry=r)
        self.seconds = Histogram("mindmotor_helper_task_seconds", "Time of a task in a helper process",
                                 ["pool", "task"], registry=r,
                                 buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.restarts = Counter("mindmotor_helper_restarts", "Helper processes started again, by why the "
                                "previous one ended: crashed, timeout, cancelled, start_failed",
                                ["pool", "reason"], registry=r)
        self.live = Gauge("mindmotor_helper_live", "Helper processes ready for tasks or running one", ["pool"],
                          registry=r, multiprocess_mode="livesum")


@dataclass(eq=False)
class _Helper:
    proc: asyncio.subprocess.Process
    started: float = field(default_factory=time.monotonic)

    async def read_frame(self):
        header = await self.proc.stdout.readexactly(wire.HEADER.size)
        (length,) = wire.HEADER.unpack(header)
        return wire.decode(await self.proc.stdout.readexactly(length))

    def kill(self) -> None:
        if self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass


class HelperPool:
    def __init__(self, name: str, size: int = 2, task_timeout_s: float = 5.0, wait_timeout_s: float = 5.0,
                 metrics: HelperMetrics | None = None, env: dict[str, str] | None = None):
        if size < 1:
            raise ValueError(f"a helper pool needs at least one helper, got {size}")
        self.name = name
        self.size = size
        self.task_timeout_s = task_timeout_s
        self.wait_timeout_s = wait_timeout_s
        self.metrics = metrics or HelperMetrics()
        self.env = env
        self._idle: asyncio.Queue[_Helper] = asyncio.Queue()
        self._helpers: set[_Helper] = set()      # started and not yet lost: idle or running a task
        self._starting: set[asyncio.Task] = set()
        self._failed_starts = 0
        self._launched = False                 # helpers started (at `start`, or at the first `run`)
        self._closed = False

    @property
    def live(self) -> int:
        """Helpers started and not dead (idle or busy)."""
        return len(self._helpers)

    async def start(self) -> None:
        """Start the helpers and wait (at most START_TIMEOUT_S) until they are ready; ones that
        cannot start keep being retried in the background (calls wait for a live one). Without
        it, the first `run` starts them (a service that never sees a structured output never
        pays for its helpers)."""
        self._ensure_started()
        await asyncio.wait(set(self._starting), timeout=START_TIMEOUT_S)

    def _ensure_started(self) -> None:
        if not self._launched:
            self._launched = True
            for _ in range(self.size):
                self._replace()

    async def run(self, task: str, **args):
        """The task's result; InvalidRequest when it refused the input; HelperFailure otherwise."""
        if self._closed:
            raise HelperFailure(f"the {self.name} helper pool is closed")
        self._ensure_started()
        started = time.perf_counter()
        wait_s = self.wait_timeout_s if self._helpers else max(self.wait_timeout_s, START_TIMEOUT_S)  # the first ones start
        try:
            helper = await asyncio.wait_for(self._idle.get(), wait_s)
        except (asyncio.TimeoutError, TimeoutError):
            self.metrics.tasks.labels(self.name, task, "busy").inc()
            raise HelperBusy(f"no {self.name} helper was free within {wait_s:g} s") from None
        try:
            reply = await self._ask(helper, task, args)
        except HelperFailure as failure:
            self.metrics.tasks.labels(self.name, task, failure.outcome).inc()
            raise
        self.metrics.seconds.labels(self.name, task).observe(time.perf_counter() - started)
        if "error" in reply:
            self.metrics.tasks.labels(self.name, task, HelperOutcome.REFUSED).inc()
            error = reply["error"]
            raise InvalidRequest(error["message"], param=error.get("param"), code=error.get("code") or "invalid_value")
        if "failed" in reply:
            self.metrics.tasks.labels(self.name, task, HelperOutcome.ERROR).inc()
            raise HelperError(f"the {task} task failed in a helper: {reply['failed']}")
        self.metrics.tasks.labels(self.name, task, HelperOutcome.OK).inc()
        return reply["ok"]

    async def _ask(self, helper: _Helper, task: str, args: dict) -> dict:
        """One request and its reply; the helper goes back to the idle queue only after a reply."""
        try:
            helper.proc.stdin.write(wire.encode({"task": task, "args": args}))
            await helper.proc.stdin.drain()
            reply = await asyncio.wait_for(helper.read_frame(), self.task_timeout_s)
        except (asyncio.TimeoutError, TimeoutError):
            await self._lose(helper, HelperOutcome.TIMEOUT)
            raise HelperTimeout(f"the {task} task took longer than {self.task_timeout_s:g} s") from None
        except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError):
            code = await self._lose(helper, HelperOutcome.CRASHED)
            raise HelperCrashed(f"the helper running {task} died ({_describe(code)})", code) from None
        except asyncio.CancelledError:
            await asyncio.shield(self._lose(helper, HelperOutcome.CANCELLED))
            raise
        self._idle.put_nowait(helper)
        return reply

    async def _lose(self, helper: _Helper, reason: HelperOutcome) -> int | None:
        """A helper that cannot be reused: reaped (killed first unless it is dying anyway: killing
        an exited child would reap it behind asyncio's child watcher, losing its exit status),
        replaced."""
        if reason is not HelperOutcome.CRASHED:
            helper.kill()
        try:
            code = await asyncio.wait_for(helper.proc.wait(), 2.0)
        except (asyncio.TimeoutError, TimeoutError):
            helper.kill()                       # closed its pipe but lives on
            code = await helper.proc.wait()
        self._forget(helper)
        log.warning("helper process lost; starting another", extra={
            "pool": self.name, "reason": reason, "exit": _describe(code), "pid": helper.proc.pid})
        self.metrics.restarts.labels(self.name, reason).inc()
        self._replace()
        return code

    def _forget(self, helper: _Helper) -> None:
        self._helpers.discard(helper)
        self.metrics.live.labels(self.name).set(len(self._helpers))

    def _replace(self) -> None:
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._start_one())
        self._starting.add(task)
        task.add_done_callback(self._started)

    def _started(self, task: asyncio.Task) -> None:
        self._starting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("starting a helper process failed", exc_info=task.exception(), extra={"pool": self.name})

    async def _start_one(self) -> None:
        """Start a helper and wait for its ready frame; retried with a backoff while starts fail."""
        while not self._closed:
            delay = min(BACKOFF_MAX_S, 0.1 * (2 ** self._failed_starts)) if self._failed_starts else 0.0
            if delay:
                await asyncio.sleep(delay)
            proc = await asyncio.create_subprocess_exec(
                *child_command([sys.executable, "-m", "mindmotor.sandbox.helper"], signal.SIGKILL),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=self._child_env())
            helper = _Helper(proc)
            try:
                await asyncio.wait_for(helper.read_frame(), START_TIMEOUT_S)
            except (asyncio.TimeoutError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                helper.kill()
                code = await proc.wait()
                self._failed_starts += 1
                self.metrics.restarts.labels(self.name, HelperOutcome.START_FAILED).inc()
                log.error("a helper process did not start", extra={
                    "pool": self.name, "error": type(exc).__name__, "exit": _describe(code),
                    "failed_starts": self._failed_starts})
                continue
            except asyncio.CancelledError:
                helper.kill()
                await proc.wait()
                raise
            self._failed_starts = 0
            if self._closed:
                helper.kill()
                await proc.wait()
                return
            self._helpers.add(helper)
            self.metrics.live.labels(self.name).set(len(self._helpers))
            self._idle.put_nowait(helper)
            return

    def _child_env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "GRPC_ENABLE_FORK_SUPPORT": "false", **(self.env or {})}
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)         # a coordinator replica's: not the helpers' business
        return env

    async def close(self) -> None:
        """Stop every helper (idle ones now; one running a task is killed)."""
        self._closed = True
        for task in list(self._starting):
            task.cancel()
        await asyncio.gather(*self._starting, return_exceptions=True)
        for helper in list(self._helpers):
            helper.proc.stdin.close()               # an idle helper exits at the end of its input
        for helper in list(self._helpers):
            try:
                await asyncio.wait_for(helper.proc.wait(), 2.0)
            except (asyncio.TimeoutError, TimeoutError):
                helper.kill()                       # one running a task
                await helper.proc.wait()
            self._forget(helper)


def _describe(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"
