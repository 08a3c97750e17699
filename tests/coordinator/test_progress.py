"""The progress guard over real gRPC: fake workers are grpc.aio servers in this process (on free
ports) whose Generate streams go silent, send keepalives or stream; a `Generation` reads them
through the coordinator's own channels, router, routing table and guard, with short limits.

A fake worker's token ids are the output positions (0, 1, 2, ...), continuing after the
continuation's tokens, so a moved stream that lost or repeated a token shows."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses

import grpc
import pytest

from mindmotor.common.roles import Role
from mindmotor.coordinator.dispatch.channels import WorkerChannels
from mindmotor.coordinator.dispatch.generation import Generation, GenerationRequest
from mindmotor.coordinator.metrics import ChoiceTimer, CoordinatorMetrics
from mindmotor.coordinator.routing.policies import LeastLoad
from mindmotor.coordinator.dispatch.progress import ProgressGuard
from mindmotor.coordinator.routing.router import Router
from mindmotor.coordinator.routing.table import InstanceView, RoutingTable
from mindmotor.coordinator.openai.sampling import SamplingOptions
from mindmotor.protocol import worker_pb2 as pb
from mindmotor.protocol import worker_pb2_grpc

MODEL = "m"
MAX_TOKENS = 12


class FakeWorker(worker_pb2_grpc.WorkerServicer):
    """`freeze_after`: the stream goes silent for good at that output position; `wait_s`: first
    keepalives (every 50 ms) for this long, as a queued request gets; `step_s` between tokens;
    `hang_prefill`: Prefill never answers."""

    def __init__(self, freeze_after: int | None = None, wait_s: float = 0.0, step_s: float = 0.01,
                 hang_prefill: bool = False, mute_s: float = 0.0):
        self.freeze_after, self.wait_s, self.step_s, self.hang_prefill = freeze_after, wait_s, step_s, hang_prefill
        self.mute_s = mute_s                 # nothing at all this long first (a call not yet started)
        self.starts: list[int] = []          # the continuation length of each Generate call
        self.cancelled = 0                   # calls whose handler was cancelled by the caller
        self.frozen = asyncio.Event()        # a stream went silent
        self.server: grpc.aio.Server | None = None
        self.address = ""

    async def start(self) -> "FakeWorker":
        STARTED.get().append(self)
        self.server = grpc.aio.server()
        worker_pb2_grpc.add_WorkerServicer_to_server(self, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        await self.server.start()
        return self

    async def Generate(self, request, context):
        start = len(request.continuation.output_token_ids)
        self.starts.append(start)
        try:
            await asyncio.sleep(self.mute_s)
            loop = asyncio.get_running_loop()
            until = loop.time() + self.wait_s
            while loop.time() < until:
                await context.write(pb.GenerateResponse(keepalive=True))
                await asyncio.sleep(0.05)
            for position in range(start, request.sampling.max_tokens):
                if self.freeze_after is not None and position >= self.freeze_after:
                    self.frozen.set()
                    await asyncio.Event().wait()             # silent, as a SIGSTOPped process
                await asyncio.sleep(self.step_s)
                last = position == request.sampling.max_tokens - 1
                await context.write(pb.GenerateResponse(token_ids=[position], text=f"<{position}>",
                                                        finish_reason="length" if last else ""))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def Prefill(self, request, context):
        try:
            if self.hang_prefill:
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return pb.PrefillResponse(handle="h", token_ids=[0], text="<0>")


class Setup:
    def __init__(self, deadline_s: float, failed_silence_s: float = 0.2, first_message_s: float = 0.0):
        self.table = RoutingTable(suspect_s=30.0)
        self.metrics = CoordinatorMetrics()
        self.router = Router(self.table, lambda model: LeastLoad())
        self.channels = WorkerChannels()
        self.guard = ProgressGuard(self.table, self.metrics, deadline_s, failed_silence_s, first_message_s)

    def add(self, instance_id: str, worker: FakeWorker, role: Role = Role.MIXED) -> InstanceView:
        view = InstanceView(instance_id, worker.address, model=MODEL, role=role, state="ready")
        self.table.upsert(view)
        return view

    def generation(self) -> Generation:
        request = GenerationRequest("req-1", MODEL, [1, 2, 3], SamplingOptions(max_tokens=MAX_TOKENS, temperature=0),
                                    MAX_TOKENS)
        return Generation(request, self.router, self.channels, self.metrics, ChoiceTimer(self.metrics, MODEL, 0.0),
                          guard=self.guard)

    def count(self, counter, *labels) -> float:
        return counter.labels(*labels)._value.get()


async def read_all(generation: Generation, on_piece=None) -> list[int]:
    tokens: list[int] = []
    async for piece in generation.stream():
        assert piece.token_ids, "a piece without tokens reached the client (a keepalive?)"
        tokens.extend(piece.token_ids)
        if on_piece is not None:
            on_piece(tokens)
    return tokens


STARTED: contextvars.ContextVar[list[FakeWorker]] = contextvars.ContextVar("started")


def run(scenario):
    """Run `scenario()` (bounded); every fake worker it started is stopped afterwards."""
    async def main():
        started: list[FakeWorker] = []
        STARTED.set(started)
        try:
            await asyncio.wait_for(scenario(), 30)
        finally:
            await asyncio.gather(*(w.server.stop(None) for w in started if w.server is not None))

    asyncio.run(main())


def test_a_silent_stream_is_given_up_at_the_deadline_and_continues_elsewhere():
    async def scenario():
        frozen, healthy = await FakeWorker(freeze_after=5).start(), await FakeWorker().start()
        s = Setup(deadline_s=0.5, failed_silence_s=0.2)
        s.add("a", frozen), s.add("b", healthy)
        generation = s.generation()
        assert await read_all(generation) == list(range(MAX_TOKENS))    # no token lost or repeated
        assert generation.instances == ["a", "b"] and healthy.starts == [5]
        assert s.count(s.metrics.stream_stalls, MODEL, "deadline") == 1
        assert s.count(s.metrics.retries, MODEL, "STALLED") == 1
        assert s.count(s.metrics.migrations, MODEL) == 1
        assert not s.table.is_routable(s.table.get("a"))                # marked failed (and reported)
        await asyncio.wait_for(_until(lambda: frozen.cancelled == 1), 5)   # the worker saw the cancel
        assert s.guard.in_flight("a") == 0
        await s.channels.close()

    run(scenario)


def test_keepalives_keep_a_waiting_stream_where_it_is():
    """A request queued for 2.5 deadlines, with keepalives flowing: not given up, and no
    keepalive reaches the client."""
    async def scenario():
        waiting, other = await FakeWorker(wait_s=2.0).start(), await FakeWorker().start()
        s = Setup(deadline_s=0.8)
        s.add("a", waiting), s.add("b", other)
        generation = s.generation()
        assert await read_all(generation) == list(range(MAX_TOKENS))
        assert generation.instances == ["a"] and other.starts == []
        assert s.count(s.metrics.stream_stalls, MODEL, "deadline") == 0
        await s.channels.close()

    run(scenario)


@pytest.mark.parametrize("verdict", ["suspect", "gone", "replaced"])
def test_a_silent_stream_on_an_instance_the_table_calls_failed_moves_at_once(verdict):
    """No deadline at all: the table's word (and the stream's silence) is enough."""
    async def scenario():
        frozen, healthy = await FakeWorker(freeze_after=5).start(), await FakeWorker().start()
        s = Setup(deadline_s=0.0, failed_silence_s=0.2)
        view, other = s.add("a", frozen), s.add("b", healthy)

        async def condemn():
            await frozen.frozen.wait()
            if verdict == "suspect":
                s.table.upsert(dataclasses.replace(view, healthy=False, state="suspect"))
            elif verdict == "gone":
                s.table.replace([other])
            else:
                s.table.upsert(dataclasses.replace(view, address="127.0.0.1:1"))

        asyncio.ensure_future(condemn())
        generation = s.generation()
        assert await read_all(generation) == list(range(MAX_TOKENS))
        assert generation.instances == ["a", "b"] and healthy.starts == [5]
        assert s.count(s.metrics.stream_stalls, MODEL, "routing_table") == 1
        await s.channels.close()

    run(scenario)


def test_this_coordinator_s_own_mark_cuts_no_other_stream_early():
    """One stalled stream of a busy worker marks it here; its other streams keep their own
    deadline (under a burst, an early cut cascaded into every instance marked and a 503)."""
    async def scenario():
        frozen, healthy = await FakeWorker(freeze_after=5).start(), await FakeWorker().start()
        s = Setup(deadline_s=1.0, failed_silence_s=0.2)
        s.add("a", frozen), s.add("b", healthy)

        async def mark():
            await frozen.frozen.wait()
            s.table.mark_failed("a", "another stream of it stalled")

        asyncio.ensure_future(mark())
        generation = s.generation()
        assert await read_all(generation) == list(range(MAX_TOKENS))
        assert s.count(s.metrics.stream_stalls, MODEL, "routing_table") == 0
        assert s.count(s.metrics.stream_stalls, MODEL, "deadline") == 1
        await s.channels.close()

    run(scenario)


@pytest.mark.parametrize("mute_s, moved", [(0.6, False), (5.0, True)])
def test_before_its_first_message_a_call_has_the_longer_deadline(mute_s, moved):
    """A worker that has not started the call yet (thousands queued) sends nothing, not even
    keepalives: that call waits `first_message_s`, not the 0.3 s deadline."""
    async def scenario():
        slow, other = await FakeWorker(mute_s=mute_s).start(), await FakeWorker().start()
        s = Setup(deadline_s=0.3, first_message_s=1.5)
        s.add("a", slow), s.add("b", other)
        generation = s.generation()
        assert await read_all(generation) == list(range(MAX_TOKENS))
        assert generation.instances == (["a", "b"] if moved else ["a"])
        assert s.count(s.metrics.stream_stalls, MODEL, "deadline") == int(moved)
        await s.channels.close()

    run(scenario)


@pytest.mark.parametrize("change", ["draining", "role", "gone"])
def test_a_stream_that_delivers_is_never_cut(change):
    """A draining instance finishes its streams, a role change cuts nothing, and a stream that
    delivers is left alone even when the table drops its instance (a restarted controller)."""
    async def scenario():
        slow, other = await FakeWorker(step_s=0.08).start(), await FakeWorker().start()
        s = Setup(deadline_s=0.0, failed_silence_s=0.6)
        view, spare = s.add("a", slow), s.add("b", other)

        def on_piece(tokens):
            if len(tokens) == 2:
                if change == "draining":
                    s.table.upsert(dataclasses.replace(view, healthy=False, state="draining"))
                elif change == "role":
                    s.table.upsert(dataclasses.replace(view, role=Role.DECODE))
                else:
                    s.table.replace([spare])

        generation = s.generation()
        assert await read_all(generation, on_piece) == list(range(MAX_TOKENS))
        assert generation.instances == ["a"] and other.starts == []
        await s.channels.close()

    run(scenario)


def test_a_prefill_on_an_instance_the_table_calls_failed_falls_back_at_once():
    """Prefill is unary (no keepalives): its own timeout bounds it, and the table's word ends it
    early; the choice then runs the ordinary way."""
    async def scenario():
        prefill, decode = await FakeWorker(hang_prefill=True).start(), await FakeWorker().start()
        s = Setup(deadline_s=0.5, failed_silence_s=0.2)
        view = s.add("p", prefill, Role.PREFILL)
        s.add("d", decode, Role.DECODE)

        async def condemn():
            await _until(lambda: s.guard.in_flight("p") == 1)
            s.table.upsert(dataclasses.replace(view, healthy=False, state="suspect"))

        asyncio.ensure_future(condemn())
        generation = s.generation()
        assert await read_all(generation) == list(range(MAX_TOKENS))
        assert generation.instances == ["d"] and decode.starts == [0]
        assert s.count(s.metrics.pd_fallbacks, MODEL, "prefill_failed") == 1
        assert s.count(s.metrics.stream_stalls, MODEL, "routing_table") == 1
        await asyncio.wait_for(_until(lambda: prefill.cancelled == 1), 5)
        await s.channels.close()

    run(scenario)


def test_a_client_that_goes_away_is_not_a_stall():
    """Cancelling the reader (the HTTP client left) cancels the call: no failure, nothing marked."""
    async def scenario():
        frozen = await FakeWorker(freeze_after=3).start()
        s = Setup(deadline_s=5.0)
        s.add("a", frozen)
        task = asyncio.ensure_future(read_all(s.generation()))
        await frozen.frozen.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert s.table.is_routable(s.table.get("a"))
        assert s.count(s.metrics.stream_stalls, MODEL, "deadline") == 0
        await asyncio.wait_for(_until(lambda: frozen.cancelled == 1), 5)
        await s.channels.close()

    run(scenario)


async def _until(predicate, interval: float = 0.01) -> None:
    while not predicate():
        await asyncio.sleep(interval)
