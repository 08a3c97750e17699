"""`AsyncLLMEngine`: the engine on its own thread, for asyncio servers.

The engine thread owns the `LLMEngine` and loops: take new requests and aborts, step, hand each
output to its request's asyncio queue. Nothing else touches the engine, so it needs no locks;
validation (read-only) runs in the caller so that bad input fails the caller at once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Sequence as Seq, TypeVar

from .config import EngineConfig
from .llm_engine import LLMEngine, RequestError
from .output import RequestOutput
from .sampling_params import SamplingParams

log = logging.getLogger("mindmotor.engine")

T = TypeVar("T")


class EngineDeadError(RuntimeError):
    """The engine thread stopped on an error; no request can be served."""


@dataclass
class _Pending:
    request_id: str
    validated: tuple
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
                 idle_check_interval_s: float = 1.0):
        self.engine = engine or LLMEngine(config or EngineConfig())
        self._new: deque[_Pending] = deque()
        self._aborts: deque[str] = deque()
        self._commands: deque[_Command] = deque()
        self._streams: dict[str, _Pending] = {}
        self._wake = threading.Event()
        self._stopping = False
        self._error: BaseException | None = None
        self._idle_check_interval_s = idle_check_interval_s
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    # ---- called from the event loop -------------------------------------------------------
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def num_requests(self) -> int:
        """Requests accepted and not yet finished."""
        return len(self._streams) + len(self._new)

    def generate(self, request_id: str, prompt: str | Seq[int], params: SamplingParams,
                 priority: int = 0, prefill_only: bool = False) -> AsyncIterator[RequestOutput]:
        """Validate now (raising `RequestError` at once for bad input), then return the stream of
        the request's outputs. Closing the stream early (the client went away) aborts the request
        and frees its blocks. `prefill_only`: see `LLMEngine.add_request`."""
        pending = self._open(request_id, self.engine.validate(prompt, params), priority)
        pending.prefill_only = prefill_only
        self._new.append(pending)
        self._wake.set()
        return self._stream(pending)

    async def add_prefilled(self, request_id: str, prompt: Seq[int], params: SamplingParams, first_token: int,
                            sent_chars: int = 0, num_cached_tokens: int = 0, priority: int = 0
                            ) -> tuple[int | None, AsyncIterator[RequestOutput]]:
        """A request prefilled on another instance (see `LLMEngine.add_prefilled`): returns the
        number of prompt blocks already held here (None: no room) and the request's stream, which
        yields once `commit_kv` or `prefill_locally` (run through `call`) has let it run. Abort it
        with `abort` if neither follows."""
        pending = self._open(request_id, self.engine.validate(prompt, params), priority)
        try:
            skip = await self.call(lambda e: e.add_prefilled(
                request_id, pending.validated, first_token, sent_chars, num_cached_tokens, priority,
                pending.arrival_time))
        except BaseException:
            self.abort(request_id)
            raise
        return skip, self._stream(pending)

    async def call(self, fn: Callable[..., T]) -> T:
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

    async def _stream(self, pending: _Pending) -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            while not finished:
                out = await pending.queue.get()
                if isinstance(out, BaseException):
                    raise EngineDeadError(f"the engine stopped: {out!r}") from out
                finished = out.finished
                yield out
        finally:
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
                self._take_new_and_aborts()
                engine.expire_pins()
                if not engine.has_unfinished_requests():
                    self._wake.wait(self._idle_check_interval_s)
                    self._wake.clear()
                    if not engine.has_unfinished_requests() and not self._new:
                        engine.check_invariants()   # idle: the pool must add up
                    continue
                for out in engine.step():
                    self._deliver(out)
        except BaseException as exc:  # the engine is broken: fail every stream rather than hang
            log.exception("engine thread failed")
            self._error = exc
        self._error = self._error or EngineDeadError("the engine was shut down")
        for pending in list(self._streams.values()):   # nobody may wait on a stopped engine
            try:
                pending.loop.call_soon_threadsafe(pending.queue.put_nowait, self._error)
            except RuntimeError:                        # that event loop is already closed
                pass
        self._streams.clear()
        while self._commands:
            _settle(self._commands.popleft(), error=self._error)

    def _take_new_and_aborts(self) -> None:
        engine = self.engine
        while self._new:
            p = self._new.popleft()
            if p.request_id not in self._streams:  # aborted before it was taken
                continue
            engine.add_request(p.request_id, None, priority=p.priority, arrival_time=p.arrival_time,
                               validated=p.validated, prefill_only=p.prefill_only)
        while self._commands:
            command = self._commands.popleft()
            try:
                _settle(command, result=command.fn(engine))
            except Exception as exc:  # noqa: BLE001 - the caller gets it
                _settle(command, error=exc)
        while self._aborts:
            rid = self._aborts.popleft()
            out = engine.abort_request(rid)
            pending = self._streams.pop(rid, None)
            if out is not None and pending is not None:
                pending.loop.call_soon_threadsafe(pending.queue.put_nowait, out)

    def _deliver(self, out: RequestOutput) -> None:
        pending = self._streams.get(out.request_id)
        if pending is None:
            return
        if out.finished:
            del self._streams[out.request_id]
        pending.loop.call_soon_threadsafe(pending.queue.put_nowait, out)


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
