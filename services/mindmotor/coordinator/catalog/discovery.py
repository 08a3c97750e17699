"""`ModelDiscovery`: the coordinator learns the models it has no local checkpoint directory for
from the workers that serve them (`ModelInfo`), so that a model the Deployer rolls out (workers
registered under `--served-model-name`) is servable without restarting the coordinators or giving
them a copy of its checkpoint.

It runs on the event loop, woken by every write to the routing table:

- A model with routable instances that the catalog does not know: one background task asks one
  routable instance for `ModelInfo` (bounded by `discovery_timeout_s`), builds the tokenizer in a
  thread and adds the model to the catalog. A failed attempt is retried on the next routable
  instance after a backoff (`discovery_backoff_s`, doubling up to `discovery_backoff_max_s`); the
  task ends when no instance is left (the next table write starts it again). Until the model is
  known its requests get the usual `model_not_found`.
- Every other healthy instance of a known model is checked (`ModelInfo` with `digest_only`,
  retried the same way while it stays healthy) against the digest of the tokenizer the model is
  served with: if a local directory's differs, a warning (local wins); if a discovered one's, an
  error (the first one stays). An instance that turns unhealthy is checked again when it comes
  back (it may have been restarted on another checkpoint).
- An instance of a deployment version whose digest differs (a rollout allowed to change the
  tokenizer): the version's digest is noted in the catalog and, the first time a digest is seen,
  its tokenizer is fetched (`ModelInfo` in full) — requests routed to that version are then
  tokenized with it (`models.py`), for a model with a local directory too (the versions that match
  it use the local one). Instances without a version that differ are a conflict (error), or, for a
  local model, a warning (local wins).
- A discovered model that no healthy instance serves with its tokenizer for `discovery_forget_s`
  (all its instances left, or only ones with another tokenizer remain — a rollout that changed
  it): discovered again from the remaining instances, else dropped from the catalog. Until then
  its requests go on as before (503 "no healthy instance" when none is routable).

Every outcome is counted in `mindmotor_coordinator_model_discovery_total{model, outcome}`
(`version_tokenizer`: a version that serves its own tokenizer).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from functools import partial
from typing import Any, Awaitable, Callable, Coroutine, TypeVar

import grpc

from mindmotor.common.tokenizer import TokenizerFiles
from mindmotor.protocol import worker_pb2 as pb

from mindmotor.coordinator.dispatch.channels import WorkerChannels
from mindmotor.coordinator.config import CoordinatorSettings
from mindmotor.coordinator.routing.table import InstanceView, RoutingTable
from mindmotor.coordinator.metrics import CoordinatorMetrics
from mindmotor.coordinator.catalog.models import ModelCatalog, ModelTokenizer

log = logging.getLogger("mindmotor.coordinator")

T = TypeVar("T")


class ModelDiscovery:
    def __init__(self, table: RoutingTable, catalog: ModelCatalog, channels: WorkerChannels,
                 metrics: CoordinatorMetrics, settings: CoordinatorSettings,
                 clock: Callable[[], float] = time.monotonic):
        self.table = table
        self.catalog = catalog
        self.channels = channels
        self.metrics = metrics
        self.timeout_s = settings.discovery_timeout_s
        self.backoff_s = settings.discovery_backoff_s
        self.backoff_max_s = settings.discovery_backoff_max_s
        self.forget_s = settings.discovery_forget_s
        self.clock = clock
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._discovering: dict[str, asyncio.Task] = {}   # model -> the task learning its tokenizer
        self._checking: dict[str, asyncio.Task] = {}      # instance id -> the task checking its digest
        self._digests: dict[str, str] = {}                # healthy instance id -> the digest it reported
        self._unbacked: dict[str, float] = {}             # discovered model -> since when no instance has its tokenizer
        table.on_change(self._wake.set)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="model-discovery")

    async def settle(self, timeout_s: float) -> None:
        """Wait (bounded) until the models the table holds now are discovered, so that the first
        requests find them."""
        self._reconcile()
        if self._discovering:
            await asyncio.wait(list(self._discovering.values()), timeout=timeout_s)

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._discovering.values(), *self._checking.values()) if t]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self._next_due())
            except TimeoutError:
                pass
            self._wake.clear()
            self._reconcile()

    def _next_due(self) -> float | None:
        """Seconds until an unbacked discovered model is due to be forgotten; None: no such model."""
        now = self.clock()
        due = [since + self.forget_s - now for since in self._unbacked.values() if since + self.forget_s > now]
        return min(due) if due else None

    # ---- one pass over the table ---------------------------------------------------------
    def _reconcile(self) -> None:
        healthy: dict[str, list[InstanceView]] = {}
        for view in self.table.all():
            if view.healthy and view.model:
                healthy.setdefault(view.model, []).append(view)
        ids = {v.instance_id for views in healthy.values() for v in views}
        for gone in set(self._digests) - ids:
            del self._digests[gone]
        self._forget_unbacked(healthy)
        for model, views in healthy.items():
            if not self.catalog.knows(model):
                if self.table.candidates(model):
                    self._start(self._discovering, model, partial(self._discover, model))
                continue
            for view in views:
                if view.instance_id not in self._digests:
                    self._start(self._checking, view.instance_id, partial(self._check, view))

    def _forget_unbacked(self, healthy: dict[str, list[InstanceView]]) -> None:
        """Discover again, or drop, the discovered models no healthy instance serves with their
        tokenizer (an instance not checked yet counts as serving it)."""
        now = self.clock()
        for model in self.catalog.discovered():
            digest = self.catalog.digest(model)
            views = healthy.get(model, [])
            if any(self._digests.get(v.instance_id, digest) == digest for v in views):
                self._unbacked.pop(model, None)
                continue
            since = self._unbacked.setdefault(model, now)
            if now - since < self.forget_s or model in self._discovering:
                continue
            if self.table.candidates(model):
                log.warning("no instance serves the tokenizer a discovered model has; discovering it again",
                            extra={"model": model, "digest": digest, "instances": len(views)})
                self._start(self._discovering, model, partial(self._discover, model))
            elif not views:
                self.catalog.forget(model)
                del self._unbacked[model]
                self.metrics.model_discovery.labels(model, "forgotten").inc()
                log.info("discovered model forgotten: no instance serves it", extra={"model": model,
                                                                                     "after_s": now - since})

    def _start(self, tasks: dict[str, asyncio.Task], key: str,
               work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `work()` as the task under `key`, unless one runs there already."""
        if key not in tasks:
            task = tasks[key] = asyncio.get_running_loop().create_task(work())
            task.add_done_callback(lambda _: tasks.pop(key, None))

    # ---- the two kinds of task -----------------------------------------------------------
    async def _discover(self, model: str) -> None:
        def pick(attempt: int) -> InstanceView | None:
            views = self.table.candidates(model)
            return views[attempt % len(views)] if views else None

        async def fetch(view: InstanceView) -> ModelTokenizer:
            info = await self._model_info(view, digest_only=False)
            files = TokenizerFiles(info.tokenizer_json, info.tokenizer_config_json)
            return await asyncio.to_thread(ModelTokenizer.build, files, f"ModelInfo of {view.address}")

        found = await self._retrying(model, pick, fetch)
        if found is None:
            return
        view, entry = found
        previous = self.catalog.digest(model)
        self.catalog.set_discovered(model, entry)
        self._digests[view.instance_id] = entry.digest
        self._unbacked.pop(model, None)
        self.metrics.model_discovery.labels(model, "discovered").inc()
        log.info("model discovered", extra={"model": model, "instance_id": view.instance_id,
                                            "address": view.address, "digest": entry.digest,
                                            "previous_digest": previous})
        self._wake.set()     # check the model's other instances against it

    async def _check(self, view: InstanceView) -> None:
        def pick(_attempt: int) -> InstanceView | None:
            current = self.table.get(view.instance_id)
            return view if current is not None and current.healthy and current.address == view.address else None

        async def fetch(v: InstanceView) -> str:
            return (await self._model_info(v, digest_only=True)).tokenizer_digest

        found = await self._retrying(view.model, pick, fetch)
        if found is None:
            return
        digest = self._digests[view.instance_id] = found[1]
        expected = self.catalog.digest(view.model)
        if expected is None:          # forgotten meanwhile: the next pass discovers it again
            return
        fields = {"model": view.model, "instance_id": view.instance_id, "address": view.address,
                  "version": view.version, "digest": digest, "expected_digest": expected}
        if view.version:
            self.catalog.note_version(view.model, view.version, digest)
        if digest == expected:
            outcome = "matched"
        elif view.version:
            outcome = "version_tokenizer"
            if not self.catalog.has_tokenizer(digest):
                entry = await self._fetch_tokenizer(view)
                if entry is None:
                    del self._digests[view.instance_id]      # checked again on the next pass
                    return
                self.catalog.add_tokenizer(entry)
            log.info("a version serves its own tokenizer; its requests are tokenized with it", extra=fields)
        elif self.catalog.is_local(view.model):
            outcome = "local_differs"
            log.warning("an instance serves another tokenizer than the local checkpoint directory's; "
                        "the local one is used", extra=fields)
        else:
            outcome = "conflict"
            log.error("instances of one model serve different tokenizers; the first one discovered is "
                      "used", extra=fields)
        self.metrics.model_discovery.labels(view.model, outcome).inc()

    async def _fetch_tokenizer(self, view: InstanceView) -> ModelTokenizer | None:
        def pick(_attempt: int) -> InstanceView | None:
            current = self.table.get(view.instance_id)
            return view if current is not None and current.healthy and current.address == view.address else None

        async def fetch(v: InstanceView) -> ModelTokenizer:
            info = await self._model_info(v, digest_only=False)
            files = TokenizerFiles(info.tokenizer_json, info.tokenizer_config_json)
            return await asyncio.to_thread(ModelTokenizer.build, files, f"ModelInfo of {v.address}")

        found = await self._retrying(view.model, pick, fetch)
        return None if found is None else found[1]

    # ---- ModelInfo, with retries ---------------------------------------------------------
    async def _model_info(self, view: InstanceView, digest_only: bool) -> pb.ModelInfoResponse:
        return await self.channels.stub(view.address).ModelInfo(pb.ModelInfoRequest(digest_only=digest_only),
                                                                timeout=self.timeout_s)

    async def _retrying(self, model: str, pick: Callable[[int], InstanceView | None],
                        attempt: Callable[[InstanceView], Awaitable[T]]) -> tuple[InstanceView, T] | None:
        """`attempt` on the instance `pick(n)` names at the n-th try, until one succeeds — (the
        instance, its result) — or `pick` names none (None). Each failure is logged, counted, and
        followed by a backoff that doubles up to `backoff_max_s`."""
        delay = self.backoff_s
        for n in itertools.count():
            view = pick(n)
            if view is None:
                return None
            try:
                return view, await attempt(view)
            except Exception as exc:  # noqa: BLE001 - an RPC error, or files that make no tokenizer: retried
                error = (f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.aio.AioRpcError)
                         else f"{type(exc).__name__}: {exc}")
                self.metrics.model_discovery.labels(model, "failed").inc()
                log.warning("ModelInfo failed; retrying", extra={
                    "model": model, "instance_id": view.instance_id, "address": view.address, "error": error,
                    "retry_in_s": delay})
            await asyncio.sleep(delay)
            delay = min(2 * delay, self.backoff_max_s)
