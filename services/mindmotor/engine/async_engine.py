"""`AsyncLLMEngine`: the engine on its own thread, for asyncio servers.

The engine thread owns the `LLMEngine` and loops: take new requests and aborts, step, hand each
output to its request's asyncio queue. Nothing else touches the engine, so it needs no locks;
validation (read-only) runs in the caller so that bad input fails the caller at once.

The loop survives whatever is raised for one request: adding it, aborting it, or a step that
fails it (`LLMEngine.step`) ends that request's stream with `RequestFailed` (or its
`RequestError`) and the others go on. Only an `EngineBroken` engine (or any error outside the
per-request work) stops the thread: every stream then ends with `EngineDeadError`, and the
`on_dead` callbacks run (the worker stops serving and exits, to be replaced).

Callers use typed methods only (generate, validate, the KV connector's read/release/finish,
stats, info); the worker's side of the KV connector registers with `connect_kv` and is handed
every `KVLoad` the scheduler starts, on the event loop of the request it is for.

Keepalives: a stream opened with `keepalive_s` yields `KEEPALIVE` when it has yielded nothing for
that long (queued, a long prefill, a KV pull) — but only while the engine thread is `progressing`
(it went round its loop within `stall_after_s`: a step done, an idle wait over). A stuck engine
thread therefore makes its streams go silent, as a frozen process does, and the caller (the
coordinator's progress deadline) can tell either from a request that merely waits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, Sequence as Seq, TypeVar

from .config import EngineConfig
from .continuation import Continuation
from .kv_connector import KVBlocks, KVLoad
from .llm_engine import EngineInfo, LLMEngine, RequestError, ValidatedRequest
from mindmotor.rules.request_rules import InvalidRequest
from .output import RequestOutput
from mindmotor.rules.sampling_params import SamplingParams

log = logging.getLogger("mindmotor.engine")

T = TypeVar("T")


class _Keepalive:
    def __repr__(self) -> str:
        return "KEEPALIVE"


KEEPALIVE = _Keepalive()   # what a stream with keepalive_s yields when it has nothing else to say


class EngineDeadError(RuntimeError):
    """The engine thread stopped on an error; no request can be served."""


class RequestFailed(RuntimeError):
    """The engine raised while serving this request (it alone failed; the engine goes on)."""


@dataclass
class _Pending:
    request_id: str
    validated: ValidatedRequest
    priority: int
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    arrival_time: float
    prefill_only: bool = False


@dataclass
class _Command:
    fn: Callable
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class AsyncLLMEngine:
    def __init__(self, config: EngineConfig | None = None, engine: LLMEngine | None = None,
                 idle_check_interval_s: float = 1.0, stall_after_s: float = 10.0):
        self.engine = engine or LLMEngine(config or EngineConfig())
        self.stall_after_s = stall_after_s
        self._progress_at = time.monotonic()    # the engine thread's last time round its loop
        self.info: EngineInfo = self.engine.info
        self._kv_loader: Callable[[KVLoad], None] | None = None
        self._prefetcher: Callable[[ValidatedRequest], Awaitable[None]] | None = None
        self._new: deque[_Pending] = deque()
        self._aborts: deque[str] = deque()
        self._commands: deque[_Command] = deque()
        self._streams: dict[str, _Pending] = {}
        self._wake = threading.Event()
        self._stopping = False
        self._error: BaseException | None = None
        self._on_dead: list[Callable[[BaseException], None]] = []
        self._dead_lock = threading.Lock()
        self._idle_check_interval_s = idle_check_interval_s
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    # ---- called from the event loop -------------------------------------------------------
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def dead(self) -> BaseException | None:
        """Why the engine thread stopped (None while it runs)."""
        return self._error

    def on_dead(self, callback: Callable[[BaseException], None]) -> None:
        """Call `callback(error)` once the engine thread has stopped on an error (from that thread;
        at once if it already has). Not called for a `shutdown`."""
        with self._dead_lock:
            error = self._error
            if error is None:
                self._on_dead.append(callback)
                return
        if not isinstance(error, _ShutDown):
            callback(error)

    @property
    def progressing(self) -> bool:
        """The engine thread runs and went round its loop within `stall_after_s` (it completed a
        step, or an idle wait ended). False for a thread stuck in one step, or stopped."""
        return self._error is None and time.monotonic() - self._progress_at < self.stall_after_s

    @property
    def num_requests(self) -> int:
        """Requests accepted and not yet finished."""
        return len(self._streams) + len(self._new)

    def validate(self, prompt: str | Seq[int], params: SamplingParams,
                 continuation: Continuation | None = None, lora: str | None = None) -> ValidatedRequest:
        """Check a request (RequestError for bad input); reads no engine state that changes
        (`lora`: the adapter's record, from the slots' host cache, under its lock)."""
        return self.engine.validate(prompt, params, continuation, lora)

    def generate(self, request_id: str, prompt: str | Seq[int], params: SamplingParams, priority: int = 0,
                 prefill_only: bool = False, continuation: Continuation | None = None,
                 keepalive_s: float = 0.0, lora: str | None = None) -> AsyncIterator[RequestOutput]:
        """Validate now (raising `RequestError` at once for bad input), then return the stream of
        the request's outputs. Closing the stream early (the client went away) aborts the request
        and frees its blocks. `prefill_only`, `continuation`: see `LLMEngine.add_request`.
        `keepalive_s` > 0: the stream also yields `KEEPALIVE` after each `keepalive_s` without an
        output, while the engine is `progressing`."""
        return self.submit(request_id, self.validate(prompt, params, continuation, lora), priority, prefill_only,
                           keepalive_s)

    def submit(self, request_id: str, request: ValidatedRequest, priority: int = 0,
               prefill_only: bool = False, keepalive_s: float = 0.0) -> AsyncIterator[RequestOutput]:
        """`generate` for a request already checked by `validate`."""
        pending = self._open(request_id, request, priority)
        pending.prefill_only = prefill_only
        compiling = None
        needs_matcher = request.params.structured is not None and request.matcher is None
        if needs_matcher or (self._prefetcher is not None and request.continuation is None):
            compiling = asyncio.get_running_loop().create_task(self._prepare(pending, needs_matcher))
        else:
            self._take(pending)
        return self._stream(pending, keepalive_s, compiling)

    async def _prepare(self, pending: _Pending, needs_matcher: bool) -> None:
        """Before the engine takes the request: its prefix's KV fetched from the shared tier (never
        failing the request), and its grammar matcher compiled."""
        if self._prefetcher is not None and pending.validated.continuation is None:
            try:
                await self._prefetcher(pending.validated)
            except EngineDeadError:
                pass                                    # the stream ends with the engine's error
            except Exception:  # noqa: BLE001 - the prefix is computed instead
                log.exception("prefetching KV from the shared tier failed; the prompt is computed here")
        if needs_matcher:
            await self._compile(pending)
        else:
            self._take(pending)

    def connect_prefetch(self, prefetcher: Callable[[ValidatedRequest], Awaitable[None]]) -> None:
        """Await `prefetcher(request)` before handing each new request to the engine (the shared
        KV tier fetches its prefix into the host tier)."""
        self._prefetcher = prefetcher

    async def take_kv_exports(self, max_blocks: int) -> list:
        """Blocks the host tier stored since the last call (see `HostKVTier.take_exports`)."""
        return await self._call(lambda e: e.kv_tier.take_exports(max_blocks) if e.kv_tier is not None else [])

    async def insert_kv_tier(self, blocks: list) -> int:
        """Store blocks from elsewhere in the host tier (see `HostKVTier.insert`)."""
        return await self._call(lambda e: e.kv_tier.insert(blocks) if e.kv_tier is not None else 0)

    def local_prefix_blocks(self, hashes: list[bytes]) -> int:
        """See `LLMEngine.local_prefix_blocks` (safe from this thread)."""
        return self.engine.local_prefix_blocks(hashes)

    def _take(self, pending: _Pending) -> None:
        self._new.append(pending)
        self._wake.set()

    async def _compile(self, pending: _Pending) -> None:
        """Build the request's grammar matcher on a large-stack thread (neither this event loop
        nor the engine thread waits for a large grammar), then hand the request to the engine; a
        spec that does not compile ends the stream with its RequestError (keepalives flow meanwhile)."""
        try:
            matcher = await asyncio.wrap_future(self.engine.start_matcher(pending.validated))
        except InvalidRequest as exc:
            self._streams.pop(pending.request_id, None)
            pending.queue.put_nowait(RequestError(exc.message, param=exc.param, code=exc.code))
            return
        pending.validated = dataclasses.replace(pending.validated, matcher=matcher)
        self._take(pending)

    # ---- the KV connector, for the worker's side of it ------------------------------------------
    def connect_kv(self, loader: Callable[[KVLoad], None]) -> None:
        """Hand every KV load the scheduler starts to `loader` (called on the event loop of the
        request it is for). Without one, a continuation's prompt is computed here."""
        self._kv_loader = loader

    async def read_pinned_kv(self, handle: str, skip_blocks: int = 0) -> KVBlocks:
        """A pinned prefill's prompt KV (KeyError: no such pin)."""
        return await self._call(lambda e: e.read_pinned_kv(handle, skip_blocks))

    async def release_kv(self, handle: str) -> bool:
        """Free a pinned prefill's blocks; False for an unknown handle."""
        return await self._call(lambda e: e.release_kv(handle))

    async def finish_kv_load(self, request_id: str, kv: KVBlocks | None) -> bool:
        """End a continuation's wait for its KV (see `LLMEngine.finish_kv_load`)."""
        return await self._call(lambda e: e.finish_kv_load(request_id, kv))

    async def price_kv_transfer(self, num_tokens: int, link: str) -> float:
        """Emulated seconds of a KV transfer, recorded on the card."""
        return await self._call(lambda e: e.price_kv_transfer(num_tokens, link))

    async def run_on_engine(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run `fn(engine)` on the engine thread, between steps (LoRA adapters' changes)."""
        return await self._call(fn)

    async def _call(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run `fn(engine)` on the engine thread (between steps) and return its result."""
        if self._error is not None:
            raise EngineDeadError(f"the engine stopped: {self._error!r}")
        loop = asyncio.get_running_loop()
        command = _Command(fn, loop.create_future(), loop)
        self._commands.append(command)
        self._wake.set()
        return await command.future

    def _open(self, request_id: str, validated: tuple, priority: int) -> _Pending:
        if self._error is not None:
            raise EngineDeadError(f"the engine stopped: {self._error!r}")
        if request_id in self._streams:
            raise RequestError(f"request id {request_id!r} is already in use")
        pending = _Pending(request_id, validated, priority, asyncio.Queue(), asyncio.get_running_loop(),
                           time.monotonic())
        self._streams[request_id] = pending
        return pending

    async def _stream(self, pending: _Pending, keepalive_s: float = 0.0,
                      compiling: asyncio.Task | None = None) -> AsyncIterator[RequestOutput]:
        finished = False
        ticker = _KeepaliveTicker(self, pending.queue, keepalive_s) if keepalive_s > 0 else None
        try:
            while not finished:
                out = await pending.queue.get()
                if ticker is not None:
                    ticker.handed_over()
                if out is KEEPALIVE:
                    yield out
                    continue
                if isinstance(out, (RequestError, RequestFailed)):
                    finished = True                 # the engine holds nothing of it any more
                    raise out
                if isinstance(out, BaseException):
                    raise EngineDeadError(f"the engine stopped: {out!r}") from out
                finished = out.finished
                yield out
        finally:
            if ticker is not None:
                ticker.stop()
            if compiling is not None:
                compiling.cancel()
            if not finished:
                self.abort(pending.request_id)

    def abort(self, request_id: str) -> None:
        self._aborts.append(request_id)
        self._wake.set()

    def stats(self):
        return self.engine.stats()

    def device_snapshot(self) -> dict:
        return self.engine.device.snapshot()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)

    # ---- the engine thread ----------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        try:
            while not self._stopping:
                self._progress_at = time.monotonic()
                self._take_new_and_aborts()
                engine.expire_pins()
                self._start_kv_loads()
                if not engine.has_unfinished_requests():
                    self._wake.wait(self._idle_check_interval_s)
                    self._wake.clear()
                    if not engine.has_unfinished_requests() and not self._new:
                        engine.check_invariants()   # idle: the pool must add up
                    continue
                outputs = engine.step()
                if outputs:
                    self._deliver(outputs)
                self._start_kv_loads()
                if not outputs and not engine.has_runnable_requests():   # waiting for KV only: until
                    self._wake.wait(engine.idle_wait_s(_NOTHING_RUNNABLE_WAIT_S))   # a host-tier load ends
                    self._wake.clear()
        except BaseException as exc:  # the engine is broken: fail every stream rather than hang
            log.critical("the engine thread failed; the engine is dead", exc_info=True,
                         extra={"error": f"{type(exc).__name__}: {exc}"})
            error: BaseException = exc
        else:
            error = _ShutDown("the engine was shut down")
        with self._dead_lock:
            self._error = error
            callbacks, self._on_dead = self._on_dead, []
        for pending in list(self._streams.values()):   # nobody may wait on a stopped engine
            self._put(pending, error)
        self._streams.clear()
        while self._commands:
            _settle(self._commands.popleft(), error=error)
        if not isinstance(error, _ShutDown):
            for callback in callbacks:
                try:
                    callback(error)
                except Exception:  # noqa: BLE001
                    log.exception("an on_dead callback failed")

    def _take_new_and_aborts(self) -> None:
        """New requests, commands and aborts; an exception raised for one of them fails it alone."""
        engine = self.engine
        while self._new:
            p = self._new.popleft()
            if p.request_id not in self._streams:  # aborted before it was taken
                continue
            try:
                engine.add_request(p.request_id, None, priority=p.priority, arrival_time=p.arrival_time,
                                   validated=p.validated, prefill_only=p.prefill_only)
            except Exception as exc:  # noqa: BLE001 - this request fails alone
                self._fail(p, exc)
        while self._commands:
            command = self._commands.popleft()
            try:
                _settle(command, result=command.fn(engine))
            except Exception as exc:  # noqa: BLE001 - the caller gets it
                _settle(command, error=exc)
        while self._aborts:
            rid = self._aborts.popleft()
            pending = self._streams.pop(rid, None)
            try:
                out = engine.abort_request(rid)
            except Exception as exc:  # noqa: BLE001 - the abort fails; the pool check will tell
                log.exception("aborting a request failed", extra={"request_id": rid})
                if pending is not None:
                    self._put(pending, RequestFailed(f"aborting it failed: {type(exc).__name__}: {exc}"))
                continue
            if out is not None and pending is not None:
                self._put(pending, out)

    def _start_kv_loads(self) -> None:
        """Hand the scheduler's new KV loads to the worker's side of the connector; with none
        connected (or a request already gone), the prompt is computed here."""
        for load in self.engine.take_kv_loads():
            pending = self._streams.get(load.request_id)
            if pending is None or self._kv_loader is None:
                self.engine.finish_kv_load(load.request_id, None)
                continue
            try:
                pending.loop.call_soon_threadsafe(self._kv_loader, load)
            except RuntimeError:                    # that event loop is already closed
                self.engine.finish_kv_load(load.request_id, None)

    def _fail(self, pending: _Pending, exc: Exception) -> None:
        """End one request's stream with its error (a RequestError as is: the request is bad)."""
        self._streams.pop(pending.request_id, None)
        if isinstance(exc, RequestError):
            self._put(pending, exc)
            return
        log.error("the engine failed to take a request", exc_info=(type(exc), exc, exc.__traceback__),
                  extra={"request_id": pending.request_id})
        self._put(pending, RequestFailed(f"{type(exc).__name__}: {exc}"))

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """A step's outputs to their streams: one hand-over per event loop per step (a thread hop
        per output cost the worker's loop a wake-up each: issue 26)."""
        streams = self._streams
        batches: dict[asyncio.AbstractEventLoop, list] = {}
        for out in outputs:
            pending = streams.get(out.request_id)
            if pending is None:
                continue
            if out.finished:
                del streams[out.request_id]
            item = RequestFailed(out.error) if out.error is not None else out
            batch = batches.get(pending.loop)
            if batch is None:
                batches[pending.loop] = batch = []
            batch.append((pending.queue, item))
        for loop, batch in batches.items():
            try:
                loop.call_soon_threadsafe(_hand_over, batch)
            except RuntimeError:                    # that event loop is already closed
                pass

    @staticmethod
    def _put(pending: _Pending, item) -> None:
        try:
            pending.loop.call_soon_threadsafe(pending.queue.put_nowait, item)
        except RuntimeError:                        # that event loop is already closed
            pass


def _hand_over(batch: list) -> None:
    """On the event loop: one step's outputs into their streams' queues."""
    for queue, item in batch:
        queue.put_nowait(item)


_NOTHING_RUNNABLE_WAIT_S = 0.05   # longest idle wait while only KV loads are outstanding


class _KeepaliveTicker:
    """Puts `KEEPALIVE` into one stream's queue when the stream has handed nothing over for
    `every_s` and the engine is progressing. One timer per `every_s` per stream, none per output."""

    def __init__(self, engine: AsyncLLMEngine, queue: asyncio.Queue, every_s: float):
        self.engine, self.queue, self.every_s = engine, queue, every_s
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()
        self.handle = self.loop.call_at(self.last + every_s, self._tick)

    def handed_over(self) -> None:
        self.last = self.loop.time()

    def _tick(self) -> None:
        now = self.loop.time()
        due = self.last + self.every_s
        if now >= due:
            if self.engine.progressing and self.queue.empty():
                self.queue.put_nowait(KEEPALIVE)
            due = now + self.every_s
        self.handle = self.loop.call_at(due, self._tick)

    def stop(self) -> None:
        self.handle.cancel()


class _ShutDown(EngineDeadError):
    """The engine thread stopped because it was asked to."""


def _settle(command: _Command, result=None, error: BaseException | None = None) -> None:
    """Complete a command's future from the engine thread."""
    def settle():
        if command.future.done():
            return
        if error is not None:
            command.future.set_exception(error)
        else:
            command.future.set_result(result)
    try:
        command.loop.call_soon_threadsafe(settle)
    except RuntimeError:                                # that event loop is already closed
        pass
