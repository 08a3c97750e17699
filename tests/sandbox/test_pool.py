"""HelperPool with real helper processes: a task that crashes its helper (SIGSEGV), exits or
hangs fails alone and the helper is replaced; a cancelled call does not leave its helper busy;
no idle helper in time is `HelperBusy`; helpers die with their parent, even a SIGKILLed one."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap

import pytest

from mindmotor.sandbox.pool import HelperBusy, HelperCrashed, HelperPool, HelperTimeout
from mindmotor.runtime.proc_tree import running


async def until(predicate, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def compiles(pool: HelperPool) -> bool:
    result = await pool.run("compile_constraint", kind="regex", spec="[a-z]+", param="guided_regex")
    return result["grammar_chars"] > 0


@pytest.mark.asyncio
async def test_a_crash_an_exit_and_a_hang_fail_their_task_alone():
    pool = HelperPool("t", size=2, task_timeout_s=1.0)
    await pool.start()
    try:
        await until(lambda: pool.live == 2)
        with pytest.raises(HelperCrashed) as crashed:
            await pool.run("crash", how="segv")
        assert crashed.value.returncode == -signal.SIGSEGV
        with pytest.raises(HelperCrashed, match="exit status 3"):
            await pool.run("crash", how="exit")
        with pytest.raises(HelperTimeout):
            await pool.run("crash", how="hang")
        assert await compiles(pool)                          # the other helper, or a replacement
        await until(lambda: pool.live == 2)                  # every lost helper was replaced
        outcomes = {s.labels["outcome"]: s.value for s in pool.metrics.tasks.collect()[0].samples
                    if s.name.endswith("_total")}
        assert outcomes == {"crashed": 2, "timeout": 1, "ok": 1}
    finally:
        await pool.close()
    assert pool.live == 0


@pytest.mark.asyncio
async def test_a_cancelled_call_costs_its_helper_not_the_pool():
    pool = HelperPool("t", size=1, task_timeout_s=30.0)
    await pool.start()
    try:
        hanging = asyncio.create_task(pool.run("crash", how="hang"))
        await until(lambda: pool._idle.empty() and pool.live == 1)
        await asyncio.sleep(0.1)
        hanging.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hanging
        assert await compiles(pool)                          # a new helper took over
    finally:
        await pool.close()


@pytest.mark.asyncio
async def test_no_idle_helper_in_time_is_busy():
    pool = HelperPool("t", size=1, task_timeout_s=30.0, wait_timeout_s=0.3)
    await pool.start()
    try:
        await until(lambda: pool.live == 1)
        hanging = asyncio.create_task(pool.run("crash", how="hang"))
        await until(lambda: pool._idle.empty())
        with pytest.raises(HelperBusy):
            await pool.run("compile_constraint", kind="regex", spec="a", param="p")
        hanging.cancel()
        await asyncio.gather(hanging, return_exceptions=True)
    finally:
        await pool.close()


def test_helpers_die_with_a_sigkilled_parent(tmp_path):
    """A serving process SIGKILLed leaves no helper behind (the exec wrapper's parent-death signal)."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent("""
        import asyncio, sys
        from mindmotor.sandbox.pool import HelperPool
        async def main():
            pool = HelperPool("t", size=2)
            await pool.start()
            while pool.live < 2:
                await asyncio.sleep(0.02)
            print(" ".join(str(h.proc.pid) for h in pool._helpers), flush=True)
            await asyncio.sleep(3600)
        asyncio.run(main())
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(running(p) for p in pids)
    finally:
        parent.kill()
        parent.wait()
    asyncio.run(_until_gone(pids))


async def _until_gone(pids: list[int]) -> None:
    await until(lambda: not any(running(p) for p in pids), timeout_s=10)
