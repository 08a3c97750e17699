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
from typing import AsyncIterator, Sequence as Seq

from .config import EngineConfig
from .llm_engine import LLMEngine, RequestError
from .output import RequestOutput
from .sampling_params import SamplingParams

log = logging.getLogger("mindmotor.engine")


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


class AsyncLLMEngine:
    def __init__(self, config: EngineConfig | None = None, engine: LLMEngine | None = None,
                 idle_check_interval_s: float = 1.0):
        self.engine = engine or LLMEngine(config or EngineConfig())
        self._new: deque[_Pending] = deque()
        self._aborts: deque[str] = deque()
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
                 priority: int = 0) -> AsyncIterator[RequestOutput]:
        """Validate now (raising `RequestError` at once for bad input), then return the stream of
        the request's outputs. Closing the stream early (the client went away) aborts the request
        and frees its blocks."""
        if self._error is not None:
            raise EngineDeadError(f"the engine stopped: {self._error!r}")
        validated = self.engine.validate(prompt, params)
        if request_id in self._streams:
            raise RequestError(f"request id {request_id!r} is already in use")
        pending = _Pending(request_id, validated, priority, asyncio.Queue(), asyncio.get_running_loop(),
                           time.monotonic())
        self._streams[request_id] = pending
        self._new.append(pending)
        self._wake.set()
        return self._stream(pending)

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

    def _take_new_and_aborts(self) -> None:
        engine = self.engine
        while self._new:
            p = self._new.popleft()
            if p.request_id not in self._streams:  # aborted before it was taken
                continue
            engine.add_request(p.request_id, None, priority=p.priority, arrival_time=p.arrival_time,
                               validated=p.validated)
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
