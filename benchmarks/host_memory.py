"""Host memory of one worker serving distinct long prompts, with and without a KV host budget.

A real `mindmotor worker` process (the bundled demo model, virtual timing) gets `--prompts`
distinct prompts of `--tokens` tokens (4 in flight); its resident memory (VmRSS) is read before,
during (peak) and after, with the worker's own KV metrics. Run once per budget:

    .venv/bin/python benchmarks/host_memory.py                          # the default budget
    .venv/bin/python benchmarks/host_memory.py --kv-host-budget 128MiB --prompts 400

Progress on stderr; ONE JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import finish, log  # noqa: E402
from mindmotor.protocol import worker_pb2 as pb  # noqa: E402
from mindmotor.protocol import worker_pb2_grpc  # noqa: E402
from mindmotor.runtime.child_process import ChildProcess  # noqa: E402

METRICS = ("mindmotor_kv_host_bytes", "mindmotor_kv_host_budget_bytes", "mindmotor_kv_host_blocks",
           "mindmotor_kv_cached_blocks", "mindmotor_kv_evictions_total", "mindmotor_kv_host_limited_total")


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.split()
            and line.split()[0] in METRICS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv-host-budget", default=None, help="the worker flag (default: its default)")
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=1500)
    parser.add_argument("--save-json", default=None)
    args = parser.parse_args()
    extra = ["--kv-host-budget", args.kv_host_budget] if args.kv_host_budget else []
    log_path = Path(tempfile.mkdtemp(prefix="host-memory-")) / "worker.log"
    child = ChildProcess("worker", ["worker", "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
                                    "--timing", "virtual", *extra], "MINDMOTOR_WORKER_READY", log_path)
    try:
        ready = child.wait_ready(120)
        stub = worker_pb2_grpc.WorkerStub(grpc.insecure_channel(f"127.0.0.1:{ready['port']}"))
        metrics_url = f"http://127.0.0.1:{ready['metrics_port']}/metrics"
        before = peak = resident_bytes(child.proc.pid)

        def one(i: int) -> int:
            request = pb.GenerateRequest(sampling=pb.SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
            request.prompt_token_ids.ids.extend([(i * 7919 + j * 31) % 4000 + 1 for j in range(args.tokens)])
            return sum(len(c.token_ids) for c in stub.Generate(request, timeout=600))

        with ThreadPoolExecutor(4) as pool:
            for n, _ in enumerate(pool.map(one, range(args.prompts)), 1):
                peak = max(peak, resident_bytes(child.proc.pid))
                if n % 50 == 0:
                    log(f"{n}/{args.prompts} prompts, rss {peak >> 20} MiB")
        after = resident_bytes(child.proc.pid)
        kv = scrape(metrics_url)
    finally:
        child.kill()
    finish({"benchmark": "host_memory", "kv_host_budget": args.kv_host_budget or "default", "prompts": args.prompts,
            "tokens": args.tokens, "rss_before_mib": before >> 20, "rss_peak_mib": peak >> 20,
            "rss_after_mib": after >> 20, **{k: int(v) for k, v in kv.items()}}, args.save_json)


if __name__ == "__main__":
    main()
