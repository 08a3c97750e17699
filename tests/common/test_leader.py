"""A leader whose lease lapsed while it was late (a stalled event loop) keeps leading if nobody took
the lease meanwhile — no flap that refuses calls in between — and steps down if someone did."""

from __future__ import annotations

import asyncio

from fake_clock import FakeClock

from mindmotor.common.leader import LeaderElector
from mindmotor.common.store import MemoryStore


def test_a_lapsed_lease_nobody_took_is_kept_without_a_flap():
    async def run():
        clock = FakeClock()
        store = MemoryStore(clock=clock)
        changes: list[bool] = []
        elector = LeaderElector(store, "a", 0.5, "owner", on_change=changes.append)
        await elector.step()
        clock.advance(2.0)                       # late by four lease lives
        await elector.step()
        assert elector.is_leader and changes == [True]
        assert await store.lease_holder("owner") == "a"

    asyncio.run(run())


def test_a_lapsed_lease_another_took_is_given_up():
    async def run():
        clock = FakeClock()
        store = MemoryStore(clock=clock)
        first, second = LeaderElector(store, "a", 0.5, "owner"), LeaderElector(store, "b", 0.5, "owner")
        await first.step()
        clock.advance(2.0)
        await second.step()                      # the standby takes the lapsed lease
        await first.step()
        assert second.is_leader and not first.is_leader

    asyncio.run(run())
