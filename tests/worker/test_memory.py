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
    assert status.load.num_blocks > 35_000                 # the emulated card's KV capacity (38,991 after MindIE's runtime rule)
    prompts = [[(7 * i + j) % 300 + 1 for j in range(200)] for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda p: collect(worker.stub.Generate(
            request(p, max_tokens=64, ignore_eos=True), timeout=60)), prompts))
    assert all(len(o.token_ids) == 64 for o in outs)
    rss = resident_bytes(worker.proc.pid)
    assert 20 * 2**20 < rss < 1 * GiB, rss                   # (the lower bound: it is the worker)


def metric(worker, name: str) -> float:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(worker.metrics_url, timeout=5) as response:
        text = response.read().decode()
    (value,) = [s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]
    return value


def test_distinct_long_prompts_keep_the_host_kv_under_the_budget(start_worker):
    """The issue's case in small: distinct ~900-token prompts on a card whose emulated pool holds
    millions of tokens; past the 4 MiB budget cached blocks are evicted, the host arrays stop growing."""
    budget = 4 * 2**20
    worker = start_worker("--timing", "virtual", "--emulate", "qwen2-7b", "--kv-host-budget", "4MiB")
    assert metric(worker, "mindmotor_kv_host_budget_bytes") == budget
    prompts = [[(13 * i + 7 * j) % 383 + 1 for j in range(900)] for i in range(24)]   # 24 × 900 tokens ≈ 10 MiB of KV
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda p: collect(worker.stub.Generate(
            request(p, max_tokens=4, ignore_eos=True), timeout=60)), prompts))
    assert all(len(o.token_ids) == 4 for o in outs)
    assert 0 < metric(worker, "mindmotor_kv_host_bytes") <= budget
    assert metric(worker, "mindmotor_kv_evictions_total") > 0
    assert metric(worker, "mindmotor_kv_host_limited_total") == 0
    assert metric(worker, "mindmotor_kv_cache_blocks") > 35_000          # admission still sees the card (38,991: MindIE's runtime rule)


def test_a_budget_that_cannot_hold_one_sequence_is_a_start_error(tiny_model):
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "mindmotor.cli", "worker", "--model", str(tiny_model), "--port", "0",
                           "--timing", "virtual", "--kv-host-budget", "64KiB"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "MINDMOTOR_WORKER_READY" not in done.stdout
    (entry,) = [json.loads(line) for line in done.stderr.splitlines() if '"worker failed"' in line]
    assert "host KV budget of 0.1 MiB" in entry["error"] and "max_model_len 1024 tokens needs 64 blocks" in entry["error"]
