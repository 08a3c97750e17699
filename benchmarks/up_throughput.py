"""The whole platform's rate of short requests: `mindmotor up` (2 workers, `--timing virtual`, a tiny
random-weight model; its default 2 coordinator replicas, controller and deployer) against a bare
uvicorn app (`coordinator_overhead_servers.py bare`: parse the JSON body, answer a fixed JSON
object) driven by the same client, in the same run, on 127.0.0.1, both serving throughout and
measured alternately at every level (so that a shared host's changing load falls on both alike).

Each side: a closed-loop client (C keep-alive connections, each sending its next request as soon as
the previous answer arrives; `benchmarks/common.py`) at C = 4, 16, 64 (quick) or 1 ... 256, until
the rate stops rising — `max_tokens` 1, prompt of 8 token ids, greedy, non-streamed
`/v1/completions` — and per level the CPU cores of `up`'s services (coordinators, workers, the
rest) and of the client, from /proc. `up_ratio_vs_bare` = up_max_rps / bare_uvicorn_rps;
`up_ratio_vs_bare_per_core` the same per core each side used at its peak (`up_rps_per_core`: all
of `up`'s processes).

    .venv/bin/python benchmarks/up_throughput.py --quick      # ~2 minutes on 2 cores

Progress on stderr; ONE JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import (completion_body, cpu_s, proc_cmdline, process_tree, strict_json,  # noqa: E402
                               sweep_interleaved)
from mindmotor.runtime.child_process import ChildProcess  # noqa: E402

SERVERS = Path(__file__).resolve().parent / "coordinator_overhead_servers.py"
SERVICES = ("coordinator", "worker", "deployer", "controller")


def log(msg: str) -> None:
    print(f"[up_throughput] {msg}", file=sys.stderr, flush=True)


def service_of(pid: int) -> str:
    """Which of `up`'s services a process is (by its `mindmotor <service>` command line)."""
    args = proc_cmdline(pid)
    for i, arg in enumerate(args):
        if arg == "mindmotor.cli" and i + 1 < len(args):
            return args[i + 1] if args[i + 1] in SERVICES else "up"
    return "up"


def cpu_by_service(root: int) -> dict[str, float]:
    out = {name: 0.0 for name in (*SERVICES, "up")}
    for pid in process_tree(root):
        out[service_of(pid)] += cpu_s([pid])
    return out


def start_up(model_dir: str, workers: int, state_dir: Path, log_path: Path) -> ChildProcess:
    up = ChildProcess("up", ["up", "--port", "0", "--workers", str(workers), "--timing", "virtual",
                             "--model", model_dir, "--state-dir", str(state_dir)],
                      "MINDMOTOR_UP_READY", log_path)
    try:
        up.wait_ready(240.0)
    except Exception:
        up.kill()
        raise
    return up


def start_bare(log_path: Path) -> ChildProcess:
    bare = ChildProcess("bare", ["bare", "127.0.0.1"], "BENCH_SERVER_READY", log_path,
                        program=[sys.executable, str(SERVERS)])
    try:
        bare.wait_ready(60.0)
    except Exception:
        bare.kill()
        raise
    return bare


def tiny_model(directory: Path) -> str:
    from mindmotor.model.testing import write_tiny_checkpoint

    return str(write_tiny_checkpoint(directory))


def run(args: argparse.Namespace) -> dict:
    quick = args.quick
    levels = args.levels or ([4, 16, 64] if quick else [1, 2, 4, 8, 16, 32, 64, 128, 256])
    duration_s, warmup_s = (2.0, 0.5) if quick else (5.0, 1.0)
    min_stop = levels[-1] if quick else 32
    workdir = Path(tempfile.mkdtemp(prefix="mindmotor-up-throughput-"))
    model_dir = args.model or tiny_model(workdir / "tiny")
    body = completion_body(Path(model_dir).name, 1)
    result: dict = {"benchmark": "up_throughput", "quick": quick, "model": model_dir, "workers": args.workers,
                    "worker_timing": "virtual", "host_cores": os.cpu_count(),
                    "client": "asyncio HTTP/1.1 keep-alive, one process (this one)",
                    "loadavg_at_start": list(os.getloadavg()), "levels": levels}
    t0 = time.perf_counter()
    log(f"mindmotor up: {args.workers} virtual-timing workers, model {model_dir}; logs in {workdir}")
    up = start_up(model_dir, args.workers, workdir / "state", workdir / "up.log")
    bare = None
    try:
        log(f"up serving on :{up.ready['port']} after {time.perf_counter() - t0:.1f} s")
        bare = start_bare(workdir / "bare.log")
        targets = {
            "up": ("127.0.0.1", int(up.ready["port"]),
                   {name: (lambda name=name: cpu_by_service(up.proc.pid)[name]) for name in ("coordinator", "worker")}
                   | {"up_all": lambda: sum(cpu_by_service(up.proc.pid).values())}),
            "bare_uvicorn": ("127.0.0.1", int(bare.ready["port"]), {"bare_uvicorn": lambda: cpu_s([bare.proc.pid])}),
        }
        result.update(sweep_interleaved(targets, "/v1/completions", body, levels, duration_s, warmup_s,
                                        min_stop_concurrency=min_stop, logger=log))
    finally:
        if bare is not None:
            bare.stop()
        up.stop(60.0)
    shutil.rmtree(workdir / "state", ignore_errors=True)
    up_rps, bare_rps = result["up"]["max_rps"], result["bare_uvicorn"]["max_rps"]
    result.update({"up_p99_ms_at_max": result["up"]["p99_ms_at_max"],
                   "wall_s": round(time.perf_counter() - t0, 1),
                   "up_max_rps": round(up_rps, 1), "bare_uvicorn_rps": round(bare_rps, 1),
                   "up_ratio_vs_bare": round(up_rps / bare_rps, 4) if bare_rps else None})
    result["up_ratio_goal_met"] = (result["up_ratio_vs_bare"] or 0) >= 0.26
    # the same per core the servers used at their peaks: what a host whose cores go to the servers
    # alone would show (on a shared host the rates follow whatever CPU the servers got)
    up_peak = max(result["up"]["levels"], key=lambda r: r["rps"])
    bare_peak = max(result["bare_uvicorn"]["levels"], key=lambda r: r["rps"])
    up_cores, bare_cores = up_peak["cpu_cores"]["up_all"], bare_peak["cpu_cores"]["bare_uvicorn"]
    result["up_rps_per_core"] = round(up_peak["rps"] / up_cores, 1) if up_cores else None
    result["bare_uvicorn_rps_per_core"] = round(bare_peak["rps"] / bare_cores, 1) if bare_cores else None
    result["up_ratio_vs_bare_per_core"] = (round(result["up_rps_per_core"] / result["bare_uvicorn_rps_per_core"], 4)
                                           if result["up_rps_per_core"] and result["bare_uvicorn_rps_per_core"] else None)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 concurrency levels of 2 s each per side")
    p.add_argument("--workers", type=int, default=2, help="workers `up` runs (default 2)")
    p.add_argument("--levels", type=int, nargs="+", default=None,
                   help="client concurrencies (default 1 2 4 ... 256; quick 4 16 64)")
    p.add_argument("--model", default=None, help="checkpoint directory (default: a tiny random-weight model)")
    p.add_argument("--save-json", default=None)
    args = p.parse_args(argv)
    result = strict_json(run(args))
    if args.save_json:
        Path(args.save_json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, allow_nan=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
