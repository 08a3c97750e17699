"""`AsyncLLMEngine`: the engine on its own thread, for asyncio servers.

The engine thread owns the `LLMEngine` and loops: take new requests and aborts, step, hand each
output to its request's asyncio queue. Nothing else touches the engine, so it needs no locks;
validation (read-only) runs in the caller so that bad input fails the caller at once.

The loop survives whatever is raised for one request: adding it, aborting it, or a step that
fails it (`LLMEngine.step`) ends that request's stream with `RequestFailed` (or its
`RequestError`) and the others go on. Only an `EngineBroken` engine (or any error outside the
per-request work) stops the thread: every stream then ends with `EngineDeadError`, and the
`on_dead` callbacks run (the worker stops serving and exits, to be replaced).
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


class RequestFailed(RuntimeError):
    """The engine raised while serving this request (it alone failed; the engine goes on)."""


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
                if isinstance(out, (RequestError, RequestFailed)):
                    finished = True                 # the engine holds nothing of it any more
                    raise out
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

    def _fail(self, pending: _Pending, exc: Exception) -> None:
        """End one request's stream with its error (a RequestError as is: the request is bad)."""
        self._streams.pop(pending.request_id, None)
        if isinstance(exc, RequestError):
            self._put(pending, exc)
            return
        log.error("the engine failed to take a request", exc_info=(type(exc), exc, exc.__traceback__),
                  extra={"request_id": pending.request_id})
        self._put(pending, RequestFailed(f"{type(exc).__name__}: {exc}"))

    def _deliver(self, out: RequestOutput) -> None:
        pending = self._streams.get(out.request_id)
        if pending is None:
            return
        if out.finished:
            del self._streams[out.request_id]
        self._put(pending, RequestFailed(out.error) if out.error is not None else out)

    @staticmethod
    def _put(pending: _Pending, item) -> None:
        try:
            pending.loop.call_soon_threadsafe(pending.queue.put_nowait, item)
        except RuntimeError:                        # that event loop is already closed
            pass


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
