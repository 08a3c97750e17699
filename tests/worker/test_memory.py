"""A worker serving a small model with the KV capacity of Qwen2-7B on a 64 GiB 910B3 stays small in
host memory: the pool is sized for the emulated card, host storage only for the blocks in use."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mindmotor.protocol import worker_pb2 as pb

from .rpc import collect, request

GiB = 2**30


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


def test_qwen2_7b_capacity_worker_stays_under_1_gib(start_worker):
    worker = start_worker("--timing", "virtual", "--emulate", "qwen2-7b")
    status = worker.stub.Status(pb.StatusRequest(), timeout=10)
    assert status.load.num_blocks > 40_000                 # the emulated card's KV capacity
    prompts = [[(7 * i + j) % 300 + 1 for j in range(200)] for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda p: collect(worker.stub.Generate(
            request(p, max_tokens=64, ignore_eos=True), timeout=60)), prompts))
    assert all(len(o.token_ids) == 64 for o in outs)
    rss = resident_bytes(worker.proc.pid)
    assert 20 * 2**20 < rss < 1 * GiB, rss                   # (the lower bound: it is the worker)
