"""`InstanceAgent`: what a worker runs to be known to the controller — register, keep the
Heartbeat stream going with the worker's load, obey the commands that come back, and when the
controller goes away (restart, failover) reconnect to the next address with backoff.

    agent = InstanceAgent(
        ["ctrl-a:50050", "ctrl-b:50050"],
        RegisterRequest(instance_id="w-1", address="10.0.0.5:50051", model="qwen2-7b",
                        role=Role.MIXED.to_proto()),
        load=lambda: InstanceLoad(running=engine.num_running, waiting=engine.num_waiting, ...),
        on_drain=lambda reason: admission.start_drain(),      # sync or async
        on_set_role=lambda role: service.set_role(role))
    await agent.start()
    await agent.wait_registered(timeout=10)
    ...
    await agent.stop()          # deregisters (a clean shutdown), then closes the stream

Each session is Register (a re-registration keeps a live instance's health state) + one Heartbeat
stream; a heartbeat goes out every interval the controller asked for, or at once after
`heartbeat_now()` (e.g. when the worker starts draining). Reconnect attempts back off
exponentially but never wait longer than one heartbeat interval. A load callback that raises is
logged and the last load is sent again. A `reregister` command (the controller
forgot the instance or declared it dead) starts a new session on the same controller. A
registration the controller refuses as invalid (INVALID_ARGUMENT) is fatal: `wait_registered`
and `wait` raise it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

import grpc

from mindmotor.common.roles import Role
from mindmotor.vocabulary import WorkerState
from mindmotor.protocol import controller_pb2, controller_pb2_grpc

from mindmotor.common import rpc

from .reconnect import Reconnector, parse_addresses

log = logging.getLogger("mindmotor.controller.agent")


@dataclass
class InstanceLoad:
    """One heartbeat's worth of load, as the worker's load callback returns it."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    outstanding_tokens: int = 0
    state: str = WorkerState.SERVING                      # SERVING | DRAINING
    role: str = ""                                        # "" = unchanged
    cached_block_hashes: Sequence[bytes] | None = None    # newest first; None: not reported
    ttft_p90_s: float = 0.0                               # recent latency (see HeartbeatRequest)
    tpot_p90_s: float = 0.0
    ttft_samples: int = 0
    tpot_samples: int = 0
    iteration_token_counts: Sequence[int] = ()            # vLLM's iteration_tokens_total (HeartbeatRequest)
    iteration_tokens_sum: float = 0.0


class RegistrationRejected(RuntimeError):
    """The controller refused the registration as invalid."""


class _Reregister(Exception):
    pass


async def _maybe_await(value):
    return await value if inspect.isawaitable(value) else value


class InstanceAgent:
    def __init__(self, controllers: str | Sequence[str], registration: controller_pb2.RegisterRequest,
                 load: Callable[[], InstanceLoad | Awaitable[InstanceLoad]] | None = None,
                 on_drain: Callable[[str], Any] | None = None,
                 on_set_role: Callable[[str], Any] | None = None,
                 rpc_timeout_s: float = 2.0, backoff_initial_s: float = 0.05, backoff_max_s: float = 2.0):
        self.addresses = parse_addresses(controllers)
        self.registration = registration
        self.load = load or InstanceLoad
        self.on_drain = on_drain
        self.on_set_role = on_set_role
        self.rpc_timeout_s = rpc_timeout_s
        self.backoff_max_s = backoff_max_s
        self.reconnector = Reconnector(self.addresses, backoff_initial_s, backoff_max_s)
        self.heartbeat_interval_s = 1.0
        self._last_load = InstanceLoad()
        self.controller: str | None = None       # the address of the current session
        self.controller_id: str | None = None
        self.sessions = 0                        # registrations that succeeded
        self.heartbeats_sent = 0
        self.registered = asyncio.Event()
        self.paused = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._callbacks: set[asyncio.Task] = set()

    @property
    def instance_id(self) -> str:
        return self.registration.instance_id

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"instance-agent-{self.instance_id}")

    async def wait_registered(self, timeout: float | None = None) -> None:
        if self._task is None:
            raise RuntimeError("the agent is not started")
        waiter = asyncio.ensure_future(self.registered.wait())
        done, _ = await asyncio.wait({waiter, self._task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._task in done:
            self._task.result()
        if not self.registered.is_set():
            raise TimeoutError(f"{self.instance_id} not registered within {timeout} s")

    async def wait(self) -> None:
        """Until the agent stops (raises what stopped it)."""
        if self._task is not None:
            await self._task

    async def stop(self, deregister: bool = True) -> None:
        """Stop heartbeating; with `deregister`, tell a controller the instance is gone."""
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for task in list(self._callbacks):
            task.cancel()
        self.registered.clear()
        if deregister:
            await self._deregister()

    def heartbeat_now(self) -> None:
        """Send the next heartbeat at once (e.g. the worker started draining)."""
        self._wake.set()

    def pause(self) -> None:
        """Keep the stream open but send no heartbeats (tests; a worker that wants to look hung)."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._wake.set()

    # ---- sessions -----------------------------------------------------------------------
    async def _run(self) -> None:
        address = self.reconnector.next_address()
        while True:
            try:
                await self._session(address)
                continue                                      # re-register on the same controller
            except RegistrationRejected:
                raise
            except Exception as exc:  # noqa: BLE001 — any failure: next controller, after a pause
                log.info("controller session ended", extra={
                    "instance_id": self.instance_id, "controller": address, "error": _describe(exc)})
            finally:
                self.registered.clear()
            await self.reconnector.failed()
            address = self.reconnector.next_address()

    async def _session(self, address: str) -> None:
        async with rpc.aio_channel(address) as channel:
            stub = controller_pb2_grpc.ControllerStub(channel)
            try:
                response = await stub.Register(self.registration, timeout=self.rpc_timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise RegistrationRejected(exc.details()) from exc
                raise
            if not response.accepted:
                raise ConnectionError(f"registration not accepted: {response.message}")
            self.heartbeat_interval_s = response.heartbeat_interval_s or 1.0
            # retry at least once per heartbeat interval: a restarted controller hears from us in time
            self.reconnector.max_s = min(self.backoff_max_s, self.heartbeat_interval_s)
            self.controller, self.controller_id = address, response.controller_id
            self.sessions += 1
            self.reconnector.succeeded()
            self.registered.set()
            log.info("registered", extra={"instance_id": self.instance_id, "controller": address,
                                          "controller_id": response.controller_id, "state": response.state})
            call = stub.Heartbeat()
            reader = asyncio.create_task(self._read_commands(call))
            try:
                await self._send_heartbeats(call, reader)
            except _Reregister:
                log.info("controller asked to re-register", extra={"instance_id": self.instance_id})
            finally:
                reader.cancel()
                call.cancel()
                await asyncio.gather(reader, return_exceptions=True)

    async def _send_heartbeats(self, call, reader: asyncio.Task) -> None:
        last_hashes: tuple[bytes, ...] | None = None
        while True:
            if not self.paused:
                load = await self._current_load()
                beat = controller_pb2.HeartbeatRequest(
                    instance_id=self.instance_id, running=load.running, waiting=load.waiting,
                    kv_usage=load.kv_usage, outstanding_tokens=load.outstanding_tokens,
                    state=load.state, role=Role(load.role).to_proto() if load.role else 0, ttft_p90_s=load.ttft_p90_s, tpot_p90_s=load.tpot_p90_s,
                    ttft_samples=load.ttft_samples, tpot_samples=load.tpot_samples,
                    iteration_token_counts=load.iteration_token_counts,
                    iteration_tokens_sum=load.iteration_tokens_sum)
                if load.cached_block_hashes is not None and tuple(load.cached_block_hashes) != last_hashes:
                    last_hashes = tuple(load.cached_block_hashes)
                    beat.cached_blocks.hashes.extend(last_hashes)
                await call.write(beat)
                self.heartbeats_sent += 1
            self._wake.clear()
            wake = asyncio.ensure_future(self._wake.wait())
            await asyncio.wait({wake, reader}, timeout=self.heartbeat_interval_s,
                               return_when=asyncio.FIRST_COMPLETED)
            wake.cancel()
            if reader.done():
                reader.result()                       # raises _Reregister or the stream's error
                raise ConnectionError("controller closed the heartbeat stream")

    async def _current_load(self) -> InstanceLoad:
        try:
            self._last_load = await _maybe_await(self.load())
        except Exception:  # noqa: BLE001 — a broken callback must not stop the heartbeats
            log.exception("load callback failed; sending the last load", extra={"instance_id": self.instance_id})
        return self._last_load

    async def _read_commands(self, call) -> None:
        async for command in call:
            kind = command.WhichOneof("command")
            log.info("command received", extra={"instance_id": self.instance_id, "command": kind})
            if kind == "reregister":
                raise _Reregister()
            if kind == "drain" and self.on_drain:
                self._callback(self.on_drain, command.drain.reason)
            elif kind == "set_role" and self.on_set_role:
                try:
                    role = Role.from_proto(command.set_role.role)
                except ValueError as exc:
                    log.warning("set_role command with a role this worker does not know; ignored",
                                extra={"instance_id": self.instance_id, "error": str(exc)})
                    continue
                if role is not None:
                    self._callback(self.on_set_role, role)

    def _callback(self, fn: Callable, arg) -> None:
        async def run():
            try:
                await _maybe_await(fn(arg))
            except Exception:  # noqa: BLE001
                log.exception("command callback failed", extra={"instance_id": self.instance_id})
            finally:
                self._wake.set()                      # report the new state soon

        task = asyncio.create_task(run())
        self._callbacks.add(task)
        task.add_done_callback(self._callbacks.discard)

    async def _deregister(self) -> None:
        request = controller_pb2.DeregisterRequest(instance_id=self.instance_id)
        ordered = ([self.controller] if self.controller else []) + [a for a in self.addresses if a != self.controller]
        for address in ordered:
            try:
                async with rpc.aio_channel(address) as channel:
                    await controller_pb2_grpc.ControllerStub(channel).Deregister(request, timeout=self.rpc_timeout_s)
                return
            except grpc.aio.AioRpcError as exc:
                log.info("deregister failed", extra={"instance_id": self.instance_id, "controller": address,
                                                     "error": _describe(exc)})


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
