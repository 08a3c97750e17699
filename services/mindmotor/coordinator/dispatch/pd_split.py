"""The prefill/decode split, as the Coordinator runs it for one choice.

    1. prefill: pick a `prefill` instance (the model's policy: least load, or the longest cached
       prefix with `cache_aware`) and call `Prefill`: the first token comes back (the client gets
       it at once) and the prompt's KV stays pinned there under a handle;
    2. decode: pick a `decode` instance (least load; a `mixed` one if no decode instance is
       routable) and call `Generate` with a `continuation` whose `kv_source` is that pin: it
       pulls the KV from the prefill instance, releases it, and streams the rest.

Failures never reach the client as errors: a prefill instance that fails (or none routable) means
the choice runs the ordinary way (prompt computed where it is decoded); a failed KV pull is the
decode worker's business (it computes the prompt itself); a decode instance that fails mid-stream
is handled like any failed worker (the request moves with the tokens produced so far: the same
continuation, without the KV source). A handoff
the decode side never confirmed is released on the prefill instance (best effort; the pin timeout
frees it otherwise).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import grpc

from mindmotor.common.roles import Role
from mindmotor.protocol import worker_pb2 as pb

from mindmotor.coordinator.dispatch.channels import WorkerChannels
from mindmotor.coordinator.routing.table import InstanceView, RoutingTable

log = logging.getLogger("mindmotor.coordinator")

PREFILL_ROLES = (Role.PREFILL,)
# where a choice goes without a handoff (first choice first); any instance serves a whole request
ORDINARY_ROLES = ((Role.MIXED,), (Role.DECODE,), (Role.PREFILL,))
# where a handed-off choice is decoded
HANDOFF_ROLES = ((Role.DECODE,), (Role.MIXED,))
RELEASE_TIMEOUT_S = 2.0     # as the worker side's (mindmotor.worker.kv_connector)


def split_available(table: RoutingTable, model: str) -> bool:
    """The model has routable prefill and decode instances."""
    return table.has_routable(model, Role.PREFILL) and table.has_routable(model, Role.DECODE)


@dataclass
class Handoff:
    """A prompt prefilled on `prefill`, its KV pinned there under `response.handle`."""
    prefill: InstanceView
    response: pb.PrefillResponse
    pulled: bool = False          # the decode instance answered (so it pulled, or fell back)

    def kv_source(self) -> pb.KVSource:
        r = self.response
        return pb.KVSource(address=self.prefill.address, handle=r.handle, node=r.node,
                           cached_tokens=r.usage.cached_tokens)


def prefill_request(request_id: str, prompt_token_ids: list[int], sampling: pb.SamplingParams,
                    priority: int, lora: str | None = None) -> pb.PrefillRequest:
    out = pb.PrefillRequest(request_id=request_id, sampling=sampling, priority=priority, lora_name=lora or "")
    out.prompt_token_ids.ids.extend(prompt_token_ids)
    return out


class Releaser:
    """Best-effort ReleaseKV calls in the background."""

    def __init__(self, channels: WorkerChannels):
        self.channels = channels
        self._tasks: set[asyncio.Task] = set()

    def release(self, handoff: Handoff) -> None:
        async def run():
            try:
                await self.channels.stub(handoff.prefill.address).ReleaseKV(
                    pb.ReleaseKVRequest(handle=handoff.response.handle), timeout=RELEASE_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                log.info("could not release pinned KV; its timeout will", extra={
                    "instance_id": handoff.prefill.instance_id, "code": exc.code().name})

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
