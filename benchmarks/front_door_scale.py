"""The front door scaled out: requests/s and p99 of short requests against 1, 2 and 4 coordinator
replicas (`mindmotor coordinator --replicas N`: N processes accepting from one listening socket,
coordinator/http/replicas.py — what `mindmotor up` runs), in front of the same virtual-timing
workers, everything on 127.0.0.1 in one run; and, from the per-process CPU measured, the replicas
and cores the design's 5,000 requests/s at P99 < 80 ms needs.

Per replica count: a closed-loop client (C keep-alive connections, each sending its next request
as soon as the previous answer arrives; `benchmarks/common.py`) at each concurrency level until the
rate stops rising — `max_tokens` 1, prompt of 8 token ids, greedy, non-streamed `/v1/completions`
— with, per level, the CPU cores each process used (coordinator replicas summed and each on its
own, the group's supervising process, workers, the client) from /proc. `coordinator_cpu_ms_per_request` (the replicas' CPU per
completed request at the 1-replica peak) gives the rate one coordinator core carries; with the
P99 < 80 ms level of one replica it gives the replicas needed (the arithmetic is in the JSON under
`design` and in docs/benchmarks.md).

On a host with fewer cores than processes the replicas share cores with the workers and the client,
so the rate cannot grow linearly with the replicas; the per-core figures are what carry over.

    .venv/bin/python benchmarks/front_door_scale.py --quick      # a few minutes on 2 cores
    .venv/bin/python benchmarks/front_door_scale.py --replicas 1 2 4 8 --workers 2

Progress on stderr; ONE JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import (HTTPConnection, best_under_p99, completion_body, cpu_s,  # noqa: E402
                               proc_cmdline, process_tree, strict_json, sweep_levels)
from mindmotor.runtime.child_process import ChildProcess  # noqa: E402

DESIGN_RPS, DESIGN_P99_MS = 5000, 80.0
HPA_TARGET_UTILIZATION = 0.7       # deploy/kubernetes/coordinator-hpa.yaml's averageUtilization


def log(msg: str) -> None:
    print(f"[front_door_scale] {msg}", file=sys.stderr, flush=True)


def start(name: str, args: list[str], ready: str, log_path: Path, timeout_s: float = 120.0) -> ChildProcess:
    proc = ChildProcess(name, args, ready, log_path)
    try:
        proc.wait_ready(timeout_s)
    except Exception:
        proc.kill()
        raise
    return proc


def start_workers(n: int, model_dir: str, log_dir: Path) -> list[ChildProcess]:
    workers = [ChildProcess(f"worker-{i}", ["worker", "--model", model_dir, "--host", "127.0.0.1", "--port", "0",
                                            "--metrics-port", "0", "--timing", "virtual"],
                            "MINDMOTOR_WORKER_READY", log_dir / f"worker-{i}.log") for i in range(n)]
    try:
        for w in workers:
            w.wait_ready(120.0)
    except Exception:
        for w in workers:
            w.kill()
        raise
    return workers


def start_coordinators(replicas: int, workers: list[ChildProcess], model: str, model_dir: str,
                       log_dir: Path) -> ChildProcess:
    args = ["coordinator", "--host", "127.0.0.1", "--port", "0", "--model", f"{model}={model_dir}",
            *[a for w in workers for a in ("--worker", f"127.0.0.1:{w.ready['port']}")]]
    if replicas > 1:
        args += ["--replicas", str(replicas)]
    return start(f"coordinators-{replicas}", args, "MINDMOTOR_COORDINATOR_READY",
                 log_dir / f"coordinators-{replicas}.log")


def replica_pids(group: ChildProcess) -> list[int]:
    """The coordinator processes serving requests: the group's replicas (started with
    `--replica-port`), or the one coordinator itself."""
    tree = process_tree(group.proc.pid)
    replicas = [p for p in tree if "--replica-port" in proc_cmdline(p)]
    return replicas or [group.proc.pid]


def wait_serving(port: int, body: bytes, timeout_s: float = 60.0) -> None:
    """Until a request answers 200 (the workers routable)."""
    async def probe() -> int:
        conn = HTTPConnection("127.0.0.1", port)
        try:
            return (await conn.request("POST", "/v1/completions", body))[0]
        except (OSError, asyncio.IncompleteReadError):
            return 0
        finally:
            conn.close()

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if asyncio.run(probe()) == 200:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the coordinators on :{port} did not answer 200 within {timeout_s:.0f} s")


def tiny_model(directory: Path) -> str:
    from mindmotor.model.testing import write_tiny_checkpoint

    return str(write_tiny_checkpoint(directory))


def design(rows: dict[int, dict]) -> dict:
    """From the 1-replica measurement (a single process, the unit a replica is): the coordinator
    CPU per request, the rate a core carries, the rate one replica keeps under the P99 target (per
    core it had), and what 5,000 req/s at P99 < 80 ms then needs. The arithmetic as text too."""
    one = rows[min(rows)]
    peak = max(one["levels"], key=lambda r: r["rps"])
    cpu_ms = peak["cpu_ms_per_request"]["coordinators"]
    per_core_rps = 1000.0 / cpu_ms if cpu_ms else math.nan
    under = best_under_p99(one["levels"], DESIGN_P99_MS)
    if under is not None:
        cores_used = under["cpu_cores"]["coordinators"]
        p99_rps_per_replica = under["rps"] / min(1.0, cores_used) if cores_used > 0 else math.nan
    else:
        cores_used, p99_rps_per_replica = math.nan, math.nan
    cores = DESIGN_RPS * cpu_ms / 1000.0 if cpu_ms else math.nan
    replicas_p99 = math.ceil(DESIGN_RPS / p99_rps_per_replica) if p99_rps_per_replica > 0 else None
    replicas_hpa = math.ceil(DESIGN_RPS / (per_core_rps * HPA_TARGET_UTILIZATION)) if per_core_rps > 0 else None
    worker_ms = peak["cpu_ms_per_request"].get("workers")
    steps = []
    if cpu_ms:
        steps.append(f"coordinator cores = {DESIGN_RPS} req/s x {cpu_ms:.3f} ms CPU per request = {cores:.1f} cores")
        steps.append(f"at the HPA's {HPA_TARGET_UTILIZATION:.0%} CPU target, one core each: replicas = ceil({DESIGN_RPS}"
                     f" / ({per_core_rps:.0f} req/s per core x {HPA_TARGET_UTILIZATION})) = {replicas_hpa}")
    if replicas_p99:
        steps.append(f"one replica keeps P99 < {DESIGN_P99_MS:.0f} ms up to {under['rps']:.0f} req/s on "
                     f"{cores_used:.2f} core(s) = {p99_rps_per_replica:.0f} req/s per full core: replicas = "
                     f"ceil({DESIGN_RPS} / {p99_rps_per_replica:.0f}) = {replicas_p99}")
    else:
        steps.append(f"no 1-replica level had P99 < {DESIGN_P99_MS:.0f} ms on this host (see the levels)")
    return {
        "target_rps": DESIGN_RPS, "target_p99_ms": DESIGN_P99_MS,
        "coordinator_cpu_ms_per_request": cpu_ms, "rps_per_coordinator_core": per_core_rps,
        "one_replica_best_rps_p99_under_80ms": under["rps"] if under else None,
        "one_replica_cores_at_that_level": cores_used,
        "one_replica_rps_p99_under_80ms_per_full_core": p99_rps_per_replica,
        "coordinator_cores_needed": cores,
        "replicas_needed_p99": replicas_p99,
        "replicas_needed_at_hpa_target": replicas_hpa, "hpa_target_utilization": HPA_TARGET_UTILIZATION,
        "replicas_needed": max(r for r in (replicas_p99, replicas_hpa) if r) if (replicas_p99 or replicas_hpa) else None,
        "worker_cpu_ms_per_request": worker_ms,
        "worker_cores_needed_virtual_timing": DESIGN_RPS * worker_ms / 1000.0 if worker_ms else None,
        "arithmetic": "; ".join(steps),
    }


def run(args: argparse.Namespace) -> dict:
    quick = args.quick
    levels = args.levels or ([2, 16, 64] if quick else [4, 8, 16, 32, 64, 128, 256])
    duration_s, warmup_s = (2.0, 0.5) if quick else (5.0, 1.0)
    workdir = Path(tempfile.mkdtemp(prefix="mindmotor-front-door-scale-"))
    model_dir = args.model or tiny_model(workdir / "tiny")
    model = Path(model_dir).name
    body = completion_body(model, 1)
    log(f"model {model_dir}; {args.workers} virtual-timing workers; replicas {args.replicas}; logs in {workdir}")
    result: dict = {"benchmark": "front_door_scale", "quick": quick, "model": model_dir,
                    "worker_timing": "virtual", "workers": args.workers, "host_cores": os.cpu_count(),
                    "client": "asyncio HTTP/1.1 keep-alive, one process (this one)",
                    "loadavg_at_start": list(os.getloadavg()), "levels": levels}
    t0 = time.perf_counter()
    rows: dict[int, dict] = {}
    workers = start_workers(args.workers, model_dir, workdir)
    try:
        worker_pids = [w.proc.pid for w in workers]
        for n in args.replicas:
            group = start_coordinators(n, workers, model, model_dir, workdir)
            try:
                port = int(group.ready["port"])
                wait_serving(port, body)
                pids = replica_pids(group)
                log(f"{n} replica(s) on :{port} (pids {pids})")
                cpu = {"coordinators": lambda: cpu_s(process_tree(group.proc.pid)),
                       "workers": lambda: cpu_s(worker_pids),
                       **{f"replica_{i}": (lambda p=p: cpu_s([p])) for i, p in enumerate(pids)}}
                if n > 1:        # the process that holds the socket and supervises the replicas
                    cpu["group_supervisor"] = lambda: cpu_s([group.proc.pid])
                rows[n] = sweep_levels(f"replicas={n}", "127.0.0.1", port, "/v1/completions", body, levels,
                                       duration_s, warmup_s, cpu, logger=log,
                                       min_stop_concurrency=max(levels[-1] if quick else 32, 1))
                under = best_under_p99(rows[n]["levels"], DESIGN_P99_MS)
                rows[n]["best_rps_p99_under_80ms"] = under["rps"] if under else None
            finally:
                group.stop()
    finally:
        for w in workers:
            w.stop()

    base = rows[min(rows)]["max_rps"]
    result["by_replicas"] = {str(n): r for n, r in rows.items()}
    result.update({
        "max_rps_by_replicas": {str(n): round(r["max_rps"], 1) for n, r in rows.items()},
        "p99_ms_at_max_by_replicas": {str(n): round(r["p99_ms_at_max"], 2) for n, r in rows.items()},
        "best_rps_p99_under_80ms_by_replicas": {str(n): r["best_rps_p99_under_80ms"] for n, r in rows.items()},
        "speedup_vs_1_replica": {str(n): round(r["max_rps"] / base, 3) if base else None for n, r in rows.items()},
        "coordinator_cores_at_max_by_replicas": {
            str(n): max(r["levels"], key=lambda x: x["rps"])["cpu_cores"]["coordinators"] for n, r in rows.items()},
        "design": design(rows),
        "wall_s": round(time.perf_counter() - t0, 1),
    })
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 concurrency levels of 2 s each per replica count")
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4], help="replica counts (default 1 2 4)")
    p.add_argument("--workers", type=int, default=2, help="virtual-timing workers behind them (default 2)")
    p.add_argument("--levels", type=int, nargs="+", default=None,
                   help="client concurrencies (default 4 8 16 32 64 128 256; quick 2 16 64)")
    p.add_argument("--model", default=None, help="checkpoint directory (default: a tiny random-weight model)")
    p.add_argument("--save-json", default=None)
    args = p.parse_args(argv)
    if any(n < 1 for n in args.replicas) or args.workers < 1:
        p.error("--replicas and --workers must be >= 1")
    result = strict_json(run(args))
    if args.save_json:
        Path(args.save_json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, allow_nan=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
