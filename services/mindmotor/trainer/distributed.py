"""Data parallelism with `torch.distributed` (gloo, CPU).

A process learns its place from the environment variables `torchrun` sets (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT); `launch.py` sets the same ones for `--nproc N`. Without
them the run is a single process and every collective below is a no-op.

Gradients are averaged explicitly, once per optimizer step (after all accumulation micro-batches),
as one flat all-reduce.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_from_env() -> DistContext:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistContext()
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="env://")
    return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(),
                       local_rank=int(os.environ.get("LOCAL_RANK", "0")))


def shutdown(ctx: DistContext) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()


def exit_finished_rank() -> None:
    """End a data-parallel rank whose work is done (checkpoints written, process group destroyed)
    without running C++ static destructors: they sometimes abort ("terminate called without an
    active exception") while gloo's threads wind down, turning a finished run into a failed rank."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()


def average_gradients(params: list[torch.nn.Parameter], ctx: DistContext) -> None:
    """Replace every gradient by its mean over the processes (one flat all-reduce)."""
    if not ctx.enabled:
        return
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= ctx.world_size
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def all_reduce_sum(values: list[float], ctx: DistContext) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    if ctx.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


def broadcast_object(obj, ctx: DistContext):
    """Rank 0's `obj` on every process."""
    if not ctx.enabled:
        return obj
    box = [obj if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj, ctx: DistContext) -> list:
    """Every process's `obj`, in rank order, on every process."""
    if not ctx.enabled:
        return [obj]
    out = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_parameters(module: torch.nn.Module, ctx: DistContext) -> None:
    """Start every process from rank 0's weights."""
    if not ctx.enabled:
        return
    with torch.no_grad():
        for tensor in module.state_dict().values():
            dist.broadcast(tensor, src=0)
