"""Does `mindmotor simulate` agree with the realtime platform? The same trace slice through
(a) real processes — four `mindmotor worker --timing realtime --emulate qwen2-7b` on an emulated
910B3 behind a `mindmotor coordinator` (least_load), an HTTP streaming client
(benchmarks/pd_realtime.py's harness) — and (b) the simulator with the same cluster description.
Compared: p50/p90 TTFT and TPOT (target: within 10%; TTFT within 5%) as the client sees them,
against `mindmotor simulate` with the serving-path overhead measured in the run (below); and as the
workers log them, against the simulator without it (the engines alone).

The simulator prices HTTP, the coordinator, tokenization and gRPC as one measured constant per
request; the host's own lag it leaves out (reported; a host-bound run says so — on a loaded 2-core
machine the host, not the emulated card, can set the pace). The last line also gives, from the same
run, the client's TTFT p50 minus the workers' and the coordinator's logged duration minus the
worker's per request (joined on the request id): the serving path as measured under this load.

    python benchmarks/sim_vs_realtime.py [--requests 80] [--rate 2] [--kind mixed_chunked]
    python benchmarks/sim_vs_realtime.py --measure-overhead   # the serving path's per-request cost

The serving path the simulator adds is measured by the run itself: after the realtime run, the
client's TTFT p50 minus the workers' logged TTFT p50 (`frontend_overhead_ms_measured`) is handed to
`mindmotor simulate --frontend-overhead-ms` (the CLI, as a user runs it, on the same slice written as
a CSV and the same cluster description as a JSON file), whose TTFT p50 and p90 are then compared
with the client's (goal: within 5 %; `ttft_within_5pct`). The simulator with its default overhead
(`ClusterSpec.frontend_overhead_s`, the last measurement documented in docs/emulator.md) is
reported beside it (`errors_with_default_overhead`). `--frontend-overhead-ms MS` feeds a given
figure instead of the run's.

`--measure-overhead` is where `ClusterSpec.frontend_overhead_s`'s default comes from: one request
at a time (max_tokens 1, a short prompt) through the idle cluster; the client's TTFT minus the
emulated step that prefills it (what the worker's emulated card sleeps) is the path around it:
HTTP, the coordinator, tokenization, gRPC both ways, SSE to the first chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:     # `python benchmarks/<this>.py` from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import BenchRequest, log, percentile, random_tokens  # noqa: E402
from mindmotor.device.cost_model import CostModel, StepShape  # noqa: E402
from mindmotor.device.profiles import get_profile  # noqa: E402
from mindmotor.device.specs import get_device_spec  # noqa: E402
from mindmotor.simulator import ClusterSpec, TraceRequest, load_trace, simulate  # noqa: E402
from mindmotor.simulator.report import summarize  # noqa: E402

MAX_PROMPT, MAX_OUTPUT = 2000, 200           # the host checkpoint's 4,096 positions


def trace_slice(n: int, rate: float) -> list[TraceRequest]:
    rows = load_trace(limit=n, rate=rate)
    return [TraceRequest(r.arrival_s, min(r.prompt_tokens, MAX_PROMPT), min(r.output_tokens, MAX_OUTPUT))
            for r in rows]


def worker_logged(log_dir: Path, kind: str) -> dict[str, list[float]]:
    """TTFT and TPOT as the workers log them ("request finished": ttft_s, duration_s from the
    engine's arrival), without the coordinator, HTTP and the client; the warm-up request (the
    first to finish) left out."""
    rows = []
    for path in sorted(log_dir.glob(f"{kind}-worker-*.log")):
        for line in path.read_text().splitlines():
            if '"request finished"' in line:
                rows.append(json.loads(line))
    rows.sort(key=lambda r: r["ts"])
    rows = rows[1:]
    return {"ttft_s": [r["ttft_s"] for r in rows],
            "tpot_s": [(r["duration_s"] - r["ttft_s"]) / (r["completion_tokens"] - 1)
                       for r in rows if r["completion_tokens"] > 1]}


def serving_path_s(log_dir: Path, kind: str) -> list[float]:
    """Per request, the coordinator's logged duration minus the worker's (joined on the request id
    the coordinator passes down): the path between them, both ways, under the run's load."""
    coordinator = {}
    for line in (log_dir / f"{kind}-coordinator.log").read_text().splitlines():
        if '"/v1/completions"' in line:
            row = json.loads(line)
            coordinator[row["request_id"]] = row["duration_s"]
    path = []
    for log_path in sorted(log_dir.glob(f"{kind}-worker-*.log")):
        for line in log_path.read_text().splitlines():
            if '"request finished"' in line:
                row = json.loads(line)
                outer = coordinator.get(row["request_id"].split("-")[0])
                if outer is not None:
                    path.append(outer - row["duration_s"])
    return path


def sim_spec(kind: str, chunk_tokens: int) -> ClusterSpec:
    from benchmarks.pd_realtime import DEVICE, PROFILE
    if kind == "mixed_chunked":
        return ClusterSpec(mixed=4, device=DEVICE, model=PROFILE, max_num_batched_tokens=chunk_tokens,
                           max_model_len=4096, routing="least_load")
    if kind == "mixed":
        return ClusterSpec(mixed=4, device=DEVICE, model=PROFILE, max_num_batched_tokens=8192,
                           enable_chunked_prefill=False, max_model_len=4096, routing="least_load")
    raise ValueError(f"unknown kind {kind!r}")


async def _instant_ttfts(url: str, model: str, prompt: list[int], n: int) -> list[float]:
    import httpx

    from benchmarks.pd_realtime import body
    from loadtest.bench_serving import RequestResult, send_request
    ttfts = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as client:
        for i in range(n + 1):                                    # the first one warms up
            result = RequestResult()
            await send_request(client, url + "/v1/completions", {},
                               body(model, BenchRequest(f"o{i}", prompt, 1)), False, time.perf_counter(), result)
            if not result.success:
                raise RuntimeError(f"instant request failed: {result.error}")
            if i:
                ttfts.append(result.ttft_s)
    return ttfts


def measure_frontend_overhead(n: int = 30, prompt_tokens: int = 32, seed: int = 0) -> dict:
    """Client TTFT of `n` one-at-a-time max_tokens=1 requests on an idle 4-worker cluster minus the
    emulated prefill step (the cost model's, host overhead included), as the worker sleeps it."""
    from benchmarks import pd_realtime
    model_dir = pd_realtime.host_checkpoint(seed)
    log_dir = Path(tempfile.mkdtemp(prefix="mindmotor-overhead-"))
    cluster = pd_realtime.start_cluster("mixed_chunked", model_dir, log_dir, 512, seed)
    try:
        prompt = random_tokens(np.random.default_rng(seed), 512, prompt_tokens)
        ttfts = asyncio.run(_instant_ttfts(cluster.url, Path(model_dir).name, prompt, n))
    finally:
        cluster.stop()
    cost = CostModel(get_device_spec(pd_realtime.DEVICE), get_profile(pd_realtime.PROFILE))
    step_s = cost.step(StepShape(prefills=[(prompt_tokens, 0)])).seconds
    overhead = [t - step_s for t in ttfts]
    return {"requests": n, "prompt_tokens": prompt_tokens, "emulated_prefill_s": round(step_s, 5),
            "client_ttft_p50_s": round(percentile(ttfts, 50), 5),
            "overhead_p10_s": round(percentile(overhead, 10), 5),
            "overhead_p50_s": round(percentile(overhead, 50), 5),
            "overhead_p90_s": round(percentile(overhead, 90), 5)}


def simulate_cli(spec: ClusterSpec, trace: list[TraceRequest], overhead_ms: float, work_dir: Path) -> dict:
    """`mindmotor simulate --json` on `trace` (written as a CSV) and `spec` (a JSON cluster file)
    with `--frontend-overhead-ms overhead_ms`, in a process of its own: its summary."""
    trace_csv, cluster_json = work_dir / "slice.csv", work_dir / "cluster.json"
    with open(trace_csv, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(("arrival_s", "prompt_tokens", "output_tokens"))
        writer.writerows((repr(t.arrival_s), t.prompt_tokens, t.output_tokens) for t in trace)
    cluster = {k: v for k, v in asdict(spec).items() if k != "frontend_overhead_s"}
    cluster_json.write_text(json.dumps(cluster))
    cmd = [sys.executable, "-m", "mindmotor.cli", "simulate", "--trace", str(trace_csv), "--cluster", str(cluster_json),
           "--frontend-overhead-ms", repr(overhead_ms), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"mindmotor simulate exited {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=80)
    parser.add_argument("--rate", type=float, default=2.0, help="requests/s (the slice is rescaled)")
    parser.add_argument("--kind", choices=("mixed_chunked", "mixed"), default="mixed_chunked")
    parser.add_argument("--chunk-tokens", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--measure-overhead", action="store_true",
                        help="measure the serving path's per-request overhead and exit")
    parser.add_argument("--frontend-overhead-ms", type=float, default=None, metavar="MS",
                        help="feed this serving path to `mindmotor simulate` (default: the client's TTFT p50 "
                             "minus the workers' logged TTFT p50, measured in this run)")
    args = parser.parse_args(argv)
    if args.measure_overhead:
        print(json.dumps(measure_frontend_overhead(seed=args.seed)))
        return 0

    from benchmarks import pd_realtime

    load_at_start = [round(x, 2) for x in os.getloadavg()]     # a busy host's queueing shows as serving path
    trace = trace_slice(args.requests, args.rate)
    spec = sim_spec(args.kind, args.chunk_tokens)
    default_sim = summarize(simulate(spec, trace))          # the default overhead (the last measurement)
    engines = summarize(simulate(replace(spec, frontend_overhead_s=0.0), trace))   # what workers log
    rng = np.random.default_rng(args.seed)
    requests = [BenchRequest(f"r{i}", random_tokens(rng, 512, t.prompt_tokens), t.output_tokens, t.arrival_s)
                for i, t in enumerate(trace)]
    model_dir = pd_realtime.host_checkpoint(args.seed)
    log_dir = Path(tempfile.mkdtemp(prefix="mindmotor-sim-vs-rt-"))
    log(f"realtime cluster {args.kind}: {len(requests)} requests at {args.rate} req/s; logs in {log_dir}")
    real = pd_realtime.run_cluster(args.kind, model_dir, requests, log_dir, args.chunk_tokens, args.seed)

    logged = worker_logged(log_dir, args.kind)
    path = serving_path_s(log_dir, args.kind)
    measured_ms = (percentile(real["ttft_s"], 50) - percentile(logged["ttft_s"], 50)) * 1e3
    overhead_ms = args.frontend_overhead_ms if args.frontend_overhead_ms is not None else max(0.0, measured_ms)
    log(f"serving path measured (client TTFT p50 - worker-logged TTFT p50): {measured_ms:.2f} ms; "
        f"mindmotor simulate --frontend-overhead-ms {overhead_ms:.2f}")
    sim = simulate_cli(spec, trace, overhead_ms, log_dir)    # what the client sees
    rows, errors, engine_errors, default_errors = [], {}, {}, {}
    for metric in ("ttft", "tpot"):
        for q in (50, 90):
            r = percentile(real[f"{metric}_s"], q)
            w = percentile(logged[f"{metric}_s"], q)
            s, e = sim[f"{metric}_s"][f"p{q}"], engines[f"{metric}_s"][f"p{q}"]
            d = default_sim[f"{metric}_s"][f"p{q}"]
            errors[f"{metric}_p{q}"] = round(s / r - 1, 4)
            engine_errors[f"{metric}_p{q}"] = round(e / w - 1, 4)
            default_errors[f"{metric}_p{q}"] = round(d / r - 1, 4)
            rows.append(f"{metric.upper()} p{q:<3} client {r * 1e3:7.1f} ms  simulated {s * 1e3:7.1f} ms "
                        f"{(s / r - 1) * 100:+6.1f}% (default overhead {d * 1e3:7.1f} ms {(d / r - 1) * 100:+6.1f}%)"
                        f"   worker-logged {w * 1e3:7.1f} ms  simulated engines "
                        f"{e * 1e3:7.1f} ms {(e / w - 1) * 100:+6.1f}%")
    print("\n".join(rows))
    worst = max(errors, key=lambda k: abs(errors[k]))
    print(json.dumps({"kind": args.kind, "requests": len(requests), "rate": args.rate,
                      "loadavg_at_start": load_at_start,
                      "max_abs_error": abs(errors[worst]), "worst": worst, "errors": errors,
                      "max_abs_error_vs_worker_logged": max(abs(v) for v in engine_errors.values()),
                      "errors_vs_worker_logged": engine_errors,
                      "realtime_failed": real["failed"], "host_lag_share": real["host_lag_share"],
                      "host_bound": real["host_bound"], "sim_wall_s": round(sim["wall_s"], 3),
                      "frontend_overhead_ms_measured": round(measured_ms, 3),
                      "frontend_overhead_ms_fed": round(overhead_ms, 3),
                      "ttft_p50_error": errors["ttft_p50"], "ttft_p90_error": errors["ttft_p90"],
                      "ttft_within_5pct": abs(errors["ttft_p50"]) <= 0.05 and abs(errors["ttft_p90"]) <= 0.05,
                      "default_frontend_overhead_s": spec.frontend_overhead_s,
                      "errors_with_default_overhead": default_errors,
                      "client_minus_worker_ttft_p50_s": round(percentile(real["ttft_s"], 50)
                                                              - percentile(logged["ttft_s"], 50), 4),
                      "coordinator_minus_worker_p50_s": round(percentile(path, 50), 4) if path else None,
                      "joined_requests": len(path)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
