"""Starting a training run in one of three ways:

- one process: `train()` runs right here;
- `--nproc N` on this machine: N processes (spawned) form a gloo group, meeting at a TCP store
  this process hosts on a port the OS chose;
- under `torchrun` (one or many machines): torchrun has set RANK/WORLD_SIZE/MASTER_ADDR/... and
  this process is one member of the group, e.g. on each of two machines:

      torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \\
               --rdzv-endpoint HOST:29400 --rdzv-id run1 \\
               -m mindmotor.trainer.cli train --preset demo --out /shared/checkpoints
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from pathlib import Path

from .config import TrainConfig
from .loop import RunOptions, TrainResult, default_run_name, train

STOP_GRACE_S = 10.0     # for the training processes to stop after SIGTERM, before SIGKILL


def exit_on_sigterm() -> None:
    """Make SIGTERM (a cancelled job) unwind like an exception, so that a checkpoint being written
    is removed instead of left half-written (it is never listed either way)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or int(os.environ.get("WORLD_SIZE", "1")) > 1


def run_training(config: TrainConfig, store_root: str | Path, options: RunOptions,
                 nproc: int = 1) -> TrainResult | None:
    """Train; returns the result when it ran in this process (None for `nproc` > 1)."""
    if nproc <= 1 or under_torchrun():
        return train(config, store_root, options)
    import torch.multiprocessing as mp

    from torch.distributed import TCPStore

    config.check_world_size(nproc)
    # Every process must use the same run name, so it is chosen here.
    options = dataclasses.replace(options, run_name=options.run_name or default_run_name())
    # This process hosts the rendezvous store (as torchrun's agent does) on a port the OS picks,
    # so no port can be taken by someone else between choosing it and binding it.
    store = TCPStore("127.0.0.1", 0, world_size=nproc, is_master=True, wait_for_workers=False)
    group = mp.start_processes(_process_main, args=(nproc, store.port, config, str(store_root), options),
                               nprocs=nproc, join=False, start_method="spawn")
    try:
        while not group.join():
            pass
    except (SystemExit, KeyboardInterrupt):
        stop_processes(group.processes)
        raise
    return None


def stop_processes(processes, grace_s: float = STOP_GRACE_S) -> None:
    """This process was told to stop (SIGTERM, Ctrl-C): tell the training processes too (SIGTERM:
    each removes the checkpoint it was writing and exits), SIGKILL those still there after
    `grace_s`. Without it they would train on to the end, this process waiting for them."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


def _process_main(local_rank: int, nproc: int, store_port: int, config: TrainConfig,
                  store_root: str, options: RunOptions) -> None:
    import torch

    from mindmotor.common.logging import setup_logging

    setup_logging("trainer")
    exit_on_sigterm()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store_port), RANK=str(local_rank),
                      LOCAL_RANK=str(local_rank), WORLD_SIZE=str(nproc),
                      TORCHELASTIC_USE_AGENT_STORE="True")   # rank 0 joins the store, not hosts it
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
    train(config, store_root, options)
    from .distributed import exit_finished_rank

    exit_finished_rank()
