"""What the coordinator costs: (a) the latency it adds to a short request over calling the worker
directly, (b) the highest rate of short requests it sustains and its CPU per request, against a
minimal FastAPI→gRPC proxy to the same worker and a bare uvicorn JSON endpoint, driven by the same
client. Everything in one run, on 127.0.0.1, all three servers on the same server stack (the
coordinator's: uvloop and httptools where installed; `--event-loop`, `--http-protocol`).

(a) The same request — prompt of 8 token ids, `max_tokens` 4, greedy, `ignore_eos`, non-streaming —
    sent N times sequentially (after a warmup) straight to the worker (gRPC `Generate`, reading the
    stream to its end), through the coordinator and through the proxy (`POST /v1/completions`),
    alternating the paths so that all see the same background load. `added_latency_p50_ms` =
    p50(coordinator) − p50(direct); target ≤ 2 ms.
(b) A closed-loop client (C keep-alive connections, each sending its next request as soon as the
    previous answer arrives), `max_tokens` 1, at each C of the levels, the three servers
    interleaved (coordinator, proxy, bare at one level, then the next level), `--reps` rounds; per
    server and level the median over the rounds. The proxy (`coordinator_overhead_servers.py
    proxy`) parses the body, calls the worker's `GenerateUnary` on a channel made as the
    coordinator's and answers the JSON: what any FastAPI front door to the worker costs.
    `rate_ratio_vs_bare_uvicorn` = max_rate_rps / bare_uvicorn_rps (goal ≥ 0.45);
    `cpu_vs_proxy` = the coordinator's CPU per request ÷ the proxy's, at C = 32 (goal ≤ 1.2);
    `added_p99_ms_c32` = p99(coordinator) − p99(proxy) at C = 32 (goal ≤ 2);
    `proxy_ratio_vs_bare_uvicorn`: the bound the proxy itself sets on the first ratio here.

The worker uses `--timing virtual` (no emulated waiting) and a tiny random-weight model, so the
worker's own time is host time only. The client is a small hand-written HTTP/1.1 client on asyncio
(much cheaper per request than httpx), in this process; it shares the host's cores with the
servers, and the CPU share of every process is reported per level (from /proc): on a shared host
CPU per request is the steadier figure, rates move with the other load.

    .venv/bin/python benchmarks/coordinator_overhead.py --quick      # ~1.5 min
    .venv/bin/python benchmarks/coordinator_overhead.py --profile    # + cProfile of the coordinator (CPU time)

Progress on stderr; ONE JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from mindmotor.runtime.child_process import ChildProcess, ChildProcessError

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:     # `python benchmarks/coordinator_overhead.py` from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import SHORT_PROMPT_IDS as PROMPT_IDS, HTTPConnection, completion_body  # noqa: E402,E501

SERVERS = Path(__file__).resolve().parent / "coordinator_overhead_servers.py"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[coordinator_overhead] {msg}", file=sys.stderr, flush=True)


# ---- processes ---------------------------------------------------------------------------------
class Server(ChildProcess):
    """A benchmarked process (`runtime.child_process.ChildProcess`), with its port and CPU time."""

    def wait_ready(self, timeout_s: float = 60.0) -> dict[str, str]:
        try:
            return super().wait_ready(timeout_s)
        except ChildProcessError:
            self.kill()
            raise

    @property
    def port(self) -> int:
        return int(self.ready["port"])

    def cpu_s(self) -> float:
        """user + system CPU seconds of the process so far."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / CLK_TCK
        except (OSError, IndexError, ValueError):
            return float("nan")


def start_worker(model_dir: str, log_dir: Path) -> Server:
    w = Server("worker", ["worker", "--model", model_dir, "--host", "127.0.0.1", "--port", "0",
                          "--metrics-port", "0", "--timing", "virtual"],
               "MINDMOTOR_WORKER_READY", log_dir / "worker.log")
    w.wait_ready()
    return w


def coordinator_args(worker_port: int, model_name: str, model_dir: str,
                     stack: tuple[str, str] = ("auto", "auto")) -> list[str]:
    return ["--host", "127.0.0.1", "--port", "0", "--worker", f"127.0.0.1:{worker_port}",
            "--model", f"{model_name}={model_dir}", "--event-loop", stack[0], "--http-protocol", stack[1]]


def start_coordinator(worker_port: int, model_name: str, model_dir: str, log_dir: Path,
                      stack: tuple[str, str] = ("auto", "auto")) -> Server:
    c = Server("coordinator", ["coordinator", *coordinator_args(worker_port, model_name, model_dir, stack)],
               "MINDMOTOR_COORDINATOR_READY", log_dir / "coordinator.log")
    c.wait_ready()
    return c


def start_helper(kind: str, args: list[str], log_dir: Path, profile_path: str | None = None,
                 stack: tuple[str, str] = ("auto", "auto")) -> Server:
    env = {"MINDMOTOR_BENCH_LOOP": stack[0], "MINDMOTOR_BENCH_HTTP": stack[1]}
    if profile_path:
        env["MINDMOTOR_BENCH_CPROFILE"] = profile_path
    s = Server(kind, [kind, *args], "BENCH_SERVER_READY", log_dir / f"{kind}.log", env=env,
               program=[sys.executable, str(SERVERS)])
    s.wait_ready()
    return s


def pct(values: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(values) * 1000.0, p)) if values else float("nan")


# ---- (a) added latency -------------------------------------------------------------------------
async def measure_added_latency(worker_port: int, coordinators: dict[str, int], model: str, n: int,
                                warmup: int, max_tokens: int = 4, procs: dict[str, Server] | None = None) -> dict:
    """Sequential, alternating: direct gRPC Generate, then each coordinator, n times (after
    `warmup` rounds). Returns p50/p90/mean per path and the added p50 of each coordinator."""
    import grpc

    from mindmotor.protocol import worker_pb2 as pb
    from mindmotor.protocol import worker_pb2_grpc as pb_grpc

    body = completion_body(model, max_tokens)
    conns = {name: HTTPConnection("127.0.0.1", port) for name, port in coordinators.items()}
    times: dict[str, list[float]] = {"direct": [], **{name: [] for name in coordinators}}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{worker_port}") as channel:
        stub = pb_grpc.WorkerStub(channel)

        async def direct() -> None:
            req = pb.GenerateRequest(sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                                ignore_eos=True))
            req.prompt_token_ids.ids.extend(PROMPT_IDS)
            tokens = 0
            async for resp in stub.Generate(req):
                tokens += len(resp.token_ids)
            assert tokens == max_tokens, f"direct call produced {tokens} tokens"

        cpu0: dict[str, float] = {}
        for i in range(warmup + n):
            if i == warmup:
                cpu0 = {name: p.cpu_s() for name, p in (procs or {}).items()}
            t = time.perf_counter()
            await direct()
            if i >= warmup:
                times["direct"].append(time.perf_counter() - t)
            for name, conn in conns.items():
                t = time.perf_counter()
                status, data = await conn.request("POST", "/v1/completions", body)
                if status != 200:
                    raise RuntimeError(f"{name} answered {status}: {data[:200]!r}")
                if i >= warmup:
                    times[name].append(time.perf_counter() - t)
            if (i + 1) % max(1, (warmup + n) // 5) == 0:
                log(f"  latency: {i + 1}/{warmup + n} rounds")
        cpu = {name: (p.cpu_s() - cpu0[name]) * 1000 / n for name, p in (procs or {}).items()}
    for conn in conns.values():
        conn.close()
    out: dict = {"n": n, "warmup": warmup, "max_tokens": max_tokens, "prompt_tokens": len(PROMPT_IDS),
                 "cpu_ms_per_request": {k: round(v, 3) for k, v in cpu.items()}}
    for name, ts in times.items():
        out[name] = {"p50_ms": pct(ts, 50), "p90_ms": pct(ts, 90), "mean_ms": float(np.mean(ts) * 1000)}
    for name in coordinators:
        out[name]["added_p50_ms"] = out[name]["p50_ms"] - out["direct"]["p50_ms"]
    return out


# ---- (b) closed-loop rate ----------------------------------------------------------------------
async def closed_loop(port: int, path: str, body: bytes, concurrency: int, duration_s: float,
                      warmup_s: float, method: str = "POST") -> dict:
    """`concurrency` connections, each sending back to back for warmup_s + duration_s; rate and
    latency over the measured part only."""
    conns = [HTTPConnection("127.0.0.1", port) for _ in range(concurrency)]
    await asyncio.gather(*(c.connect() for c in conns))
    start = time.perf_counter()
    measure_from = start + warmup_s
    stop_at = measure_from + duration_s
    latencies: list[float] = []
    errors: dict[str, int] = {}

    async def loop(conn: HTTPConnection) -> None:
        while True:
            t = time.perf_counter()
            if t >= stop_at:
                return
            try:
                status, _ = await conn.request(method, path, body)
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                conn.close()
                conn.writer = None
                await asyncio.sleep(0.01)
                continue
            done = time.perf_counter()
            if done >= measure_from and done < stop_at:
                if status == 200:
                    latencies.append(done - t)
                else:
                    errors[f"http_{status}"] = errors.get(f"http_{status}", 0) + 1

    await asyncio.gather(*(loop(c) for c in conns))
    for c in conns:
        c.close()
    return {"concurrency": concurrency, "requests": len(latencies), "rps": len(latencies) / duration_s,
            "p50_ms": pct(latencies, 50), "p99_ms": pct(latencies, 99), "errors": errors}


def measure_level(name: str, port: int, body: bytes, c: int, duration_s: float, warmup_s: float,
                  procs: dict[str, Server]) -> dict:
    """One closed-loop run at concurrency `c`, with the CPU share (cores) of each process in
    `procs` and of this client, and the CPU milliseconds each spends per completed request."""
    cpu0 = {k: p.cpu_s() for k, p in procs.items()}
    client0, wall0 = time.process_time(), time.perf_counter()
    row = asyncio.run(closed_loop(port, "/v1/completions", body, c, duration_s, warmup_s))
    wall = time.perf_counter() - wall0
    row["cpu_s"] = {k: p.cpu_s() - cpu0[k] for k, p in procs.items()}
    row["cpu_s"]["client"] = time.process_time() - client0
    row["wall_s"] = wall
    row["cpu_cores"] = {k: round(v / wall, 3) for k, v in row["cpu_s"].items()}
    # CPU milliseconds per completed request (warmup included in the CPU time, so slightly high):
    # 1000 / this is the rate one core could carry
    done = row["rps"] * wall if row["rps"] else 0
    row["cpu_ms_per_request"] = {k: round(v * wall * 1000 / done, 3) if done else None
                                 for k, v in row["cpu_cores"].items()}
    log(f"  {name:<12} C={c:<4} {row['rps']:8.1f} req/s  p50 {row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms"
        f"  cpu ms/req {row['cpu_ms_per_request']}" + (f"  errors {row['errors']}" if row["errors"] else ""))
    return row


def interleaved(servers: dict[str, tuple[int, dict[str, Server]]], body: bytes, levels: list[int], reps: int,
                duration_s: float, warmup_s: float) -> dict[str, dict]:
    """Every server at every level, interleaved (all servers at one level, then the next), `reps`
    rounds; per server and level the round with the median rate, and the CPU per request over all
    the rounds (their CPU seconds, less what each process spends idle, over their requests: a round
    that stalled for want of a core weighs by what it did)."""
    runs: dict[str, dict[int, list[dict]]] = {name: {c: [] for c in levels} for name in servers}
    # each process's CPU while idle (timers, status polls, the loop-lag monitor): per second, taken
    # off its CPU per request, which at a low rate it would otherwise inflate
    procs_all = {k: p for _, procs in servers.values() for k, p in procs.items()}
    idle0, t0 = {k: p.cpu_s() for k, p in procs_all.items()}, time.perf_counter()
    time.sleep(2.0)
    idle = {k: max(0.0, (p.cpu_s() - idle0[k]) / (time.perf_counter() - t0)) for k, p in procs_all.items()}
    idle["client"] = 0.0
    log(f"idle CPU (cores): { {k: round(v, 4) for k, v in idle.items()} }")
    for rep in range(reps):
        log(f"round {rep + 1}/{reps}")
        for c in levels:
            for name, (port, procs) in servers.items():
                runs[name][c].append(measure_level(name, port, body, c, duration_s, warmup_s, procs))
    out = {}
    for name in servers:
        rows = []
        for c in levels:
            ordered = sorted(runs[name][c], key=lambda r: r["rps"])
            median = dict(ordered[len(ordered) // 2])
            median["rounds_rps"] = [round(r["rps"], 1) for r in runs[name][c]]
            done = sum(r["rps"] * r["wall_s"] for r in runs[name][c])
            median["cpu_ms_per_request"] = {
                k: round(sum(max(0.0, r["cpu_s"][k] - idle[k] * r["wall_s"]) for r in runs[name][c]) * 1000 / done, 3)
                if done else None for k in median["cpu_s"]}
            median["cpu_ms_per_request_raw"] = {k: round(sum(r["cpu_s"][k] for r in runs[name][c]) * 1000 / done, 3)
                                                if done else None for k in median["cpu_s"]}
            median["idle_cores"] = {k: round(idle[k], 4) for k in median["cpu_s"]}
            rows.append(median)
        peak = max(rows, key=lambda r: r["rps"])
        out[name] = {"levels": rows, "max_rps": peak["rps"], "at_concurrency": peak["concurrency"],
                     "p50_ms_at_max": peak["p50_ms"], "p99_ms_at_max": peak["p99_ms"]}
    return out


def at_level(rate: dict, c: int) -> dict | None:
    return next((r for r in rate["levels"] if r["concurrency"] == c), None)


def best_under_p99(levels: list[dict], p99_ms: float) -> dict | None:
    ok = [r for r in levels if r["p99_ms"] < p99_ms and not r["errors"]]
    return max(ok, key=lambda r: r["rps"]) if ok else None


def profile_summary(path: str, top: int = 18) -> list[dict]:
    """Top functions of a cProfile dump by internal time."""
    stats = pstats.Stats(path)
    total = stats.total_tt
    rows = []
    for (file, line, func), (cc, nc, tt, ct, _callers) in stats.stats.items():
        rows.append({"function": f"{Path(file).name}:{line}:{func}", "file": file, "calls": nc,
                     "tottime_s": round(tt, 4), "cumtime_s": round(ct, 4),
                     "tottime_share": round(tt / total, 4) if total else 0.0})
    rows.sort(key=lambda r: r["tottime_s"], reverse=True)
    return rows[:top]


def profile_by_area(path: str) -> dict:
    """Internal time grouped by where the code lives (a coarse map of the coordinator's CPU)."""
    stats = pstats.Stats(path)
    areas: dict[str, float] = {}
    for (file, _line, _func), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():
        f = file.replace("\\", "/")
        if "/mindmotor/coordinator/" in f:
            key = "mindmotor.coordinator"
        elif "/mindmotor/" in f:
            key = "mindmotor (other)"
        elif "/site-packages/" in f:
            key = f.split("/site-packages/")[1].split("/")[0]
        elif f.startswith("~") or f.startswith("<"):
            key = "builtins/C"
        else:
            path = Path(f)
            key = "stdlib:" + (path.parent.name if path.stem == "__init__" else path.stem)
        areas[key] = areas.get(key, 0.0) + tt
    total = sum(areas.values()) or 1.0
    top = sorted(areas.items(), key=lambda kv: kv[1], reverse=True)[:14]
    return {k: round(v / total, 4) for k, v in top}


# ---- the benchmark -----------------------------------------------------------------------------
def tiny_model(directory: Path) -> str:
    from mindmotor.model.testing import write_tiny_checkpoint

    return str(write_tiny_checkpoint(directory))


def run(args: argparse.Namespace) -> dict:
    quick = args.quick
    n = args.n or (60 if quick else 400)
    warmup = 10 if quick else 40
    levels = [1, 8, 32, 64] if quick else [1, 2, 4, 8, 16, 32, 64, 128]
    reps = args.reps or (2 if quick else 3)
    duration_s, warmup_s = (2.0, 0.5) if quick else (3.0, 0.5)     # a 1 s window saw no answer at C = 64 under load
    stack = (args.event_loop, args.http_protocol)
    workdir = Path(tempfile.mkdtemp(prefix="mindmotor-coord-overhead-"))
    model_dir = args.model or tiny_model(workdir / "tiny")
    model = Path(model_dir).name
    log(f"model {model_dir}; logs in {workdir}")
    servers: list[Server] = []
    from mindmotor.common.event_loop import loop_name
    from mindmotor.common.http_limits import resolve_protocol

    result: dict = {"benchmark": "coordinator_overhead", "quick": quick, "model": model_dir,
                    "worker_timing": "virtual", "client": "asyncio HTTP/1.1 keep-alive, in the benchmark process",
                    "server_stack": {"event_loop": loop_name(stack[0]), "http": resolve_protocol(stack[1])},
                    "host_cores": os.cpu_count(), "loadavg_at_start": list(os.getloadavg()), "reps": reps}
    t_start = time.perf_counter()
    try:
        worker = start_worker(model_dir, workdir)
        servers.append(worker)
        coord = start_coordinator(worker.port, model, model_dir, workdir, stack)
        servers.append(coord)
        proxy = start_helper("proxy", [f"127.0.0.1:{worker.port}"], workdir, stack=stack)
        servers.append(proxy)
        bare = start_helper("bare", ["127.0.0.1"], workdir, stack=stack)
        servers.append(bare)
        log(f"worker :{worker.port}, coordinator :{coord.port}, proxy :{proxy.port}, bare :{bare.port}; "
            f"stack {result['server_stack']}")

        log(f"(a) added latency: {n} sequential requests per path (max_tokens 4), {warmup} warmup")
        lat = measure_added_latency(worker.port, {"coordinator": coord.port, "proxy": proxy.port}, model, n, warmup,
                                    procs={"coordinator": coord, "proxy": proxy})
        lat = asyncio.run(lat)
        result["latency"] = lat
        log(f"  direct p50 {lat['direct']['p50_ms']:.2f} ms; coordinator p50 {lat['coordinator']['p50_ms']:.2f} ms "
            f"(+{lat['coordinator']['added_p50_ms']:.2f}); proxy p50 {lat['proxy']['p50_ms']:.2f} ms "
            f"(+{lat['proxy']['added_p50_ms']:.2f}); sequential CPU ms/request {lat['cpu_ms_per_request']}")

        body = completion_body(model, 1)
        log(f"(b) closed-loop rate, max_tokens 1, levels {levels}, {reps} interleaved rounds")
        rates = interleaved({"coordinator": (coord.port, {"coordinator": coord, "worker": worker}),
                             "proxy": (proxy.port, {"proxy": proxy, "worker": worker}),
                             "bare-uvicorn": (bare.port, {"bare_uvicorn": bare})},
                            body, levels, reps, duration_s, warmup_s)
        result["rate_coordinator"], result["rate_proxy"] = rates["coordinator"], rates["proxy"]
        result["rate_bare_uvicorn"] = rates["bare-uvicorn"]
        coord.stop()
        proxy.stop()
        bare.stop()

        if args.profile:
            prof_path = str(workdir / "coordinator.prof")
            peak_c = max(16, result["rate_coordinator"]["at_concurrency"])
            log(f"profile: coordinator under cProfile (thread CPU time), C={peak_c}, {args.profile_s:.0f} s")
            profiled = start_helper("coordinator", coordinator_args(worker.port, model, model_dir, stack),
                                    workdir, profile_path=prof_path, stack=stack)
            servers.append(profiled)
            asyncio.run(closed_loop(profiled.port, "/v1/completions", body, 4, 1.0, 0.2))
            row = asyncio.run(closed_loop(profiled.port, "/v1/completions", body, peak_c, args.profile_s, 0.5))
            profiled.stop()
            result["profile"] = {"concurrency": peak_c, "rps_under_cprofile": row["rps"], "stats_file": prof_path,
                                 "by_area": profile_by_area(prof_path), "top_tottime": profile_summary(prof_path)}
    finally:
        for s in servers:
            s.stop()

    rc, rp, rb = result["rate_coordinator"], result["rate_proxy"], result["rate_bare_uvicorn"]
    lat = result["latency"]
    design = {"target_rps": 5000, "target_p99_ms": 80}
    best = best_under_p99(rc["levels"], 80.0)
    design["coordinator_best_rps_with_p99_under_80ms"] = best["rps"] if best else 0.0
    design["reachable_here"] = design["coordinator_best_rps_with_p99_under_80ms"] >= 5000
    design["replicas_needed_at_measured_rate"] = (
        int(np.ceil(5000 / rc["max_rps"])) if rc["max_rps"] > 0 else None)
    c32, p32, b32 = at_level(rc, 32), at_level(rp, 32), at_level(rb, 32)
    cpu32 = {"coordinator": c32["cpu_ms_per_request"]["coordinator"] if c32 else None,
             "proxy": p32["cpu_ms_per_request"]["proxy"] if p32 else None,
             "bare_uvicorn": b32["cpu_ms_per_request"]["bare_uvicorn"] if b32 else None,
             "worker_via_coordinator": c32["cpu_ms_per_request"]["worker"] if c32 else None,
             "worker_via_proxy": p32["cpu_ms_per_request"]["worker"] if p32 else None}
    result.update({
        "direct_p50_ms": lat["direct"]["p50_ms"], "direct_p90_ms": lat["direct"]["p90_ms"],
        "coordinator_p50_ms": lat["coordinator"]["p50_ms"], "coordinator_p90_ms": lat["coordinator"]["p90_ms"],
        "proxy_p50_ms": lat["proxy"]["p50_ms"],
        "added_latency_p50_ms": lat["coordinator"]["added_p50_ms"],
        "added_latency_target_met": lat["coordinator"]["added_p50_ms"] <= 2.0,
        "max_rate_rps": rc["max_rps"], "proxy_max_rps": rp["max_rps"], "bare_uvicorn_rps": rb["max_rps"],
        "rate_ratio_vs_bare_uvicorn": rc["max_rps"] / rb["max_rps"] if rb["max_rps"] else None,
        "proxy_ratio_vs_bare_uvicorn": rp["max_rps"] / rb["max_rps"] if rb["max_rps"] else None,
        "rate_ratio_vs_proxy": rc["max_rps"] / rp["max_rps"] if rp["max_rps"] else None,
        "cpu_ms_per_request_c32": cpu32,
        "cpu_ms_per_request_sequential": lat["cpu_ms_per_request"],
        "cpu_vs_proxy_sequential": (lat["cpu_ms_per_request"]["coordinator"] / lat["cpu_ms_per_request"]["proxy"])
        if lat["cpu_ms_per_request"].get("proxy") else None,
        "cpu_vs_proxy": (cpu32["coordinator"] / cpu32["proxy"]) if cpu32["coordinator"] and cpu32["proxy"] else None,
        "added_p99_ms_c32": (c32["p99_ms"] - p32["p99_ms"]) if c32 and p32 else None,
        "design_5000rps_p99_80ms": design, "wall_s": round(time.perf_counter() - t_start, 1),
    })
    result["rate_ratio_target_met"] = (result["rate_ratio_vs_bare_uvicorn"] or 0) >= 0.45
    result["cpu_vs_proxy_target_met"] = result["cpu_vs_proxy"] is not None and result["cpu_vs_proxy"] <= 1.2
    result["added_p99_target_met"] = result["added_p99_ms_c32"] is not None and result["added_p99_ms_c32"] <= 2.0
    return result


def finite(obj):
    """NaN (no measurement) -> None, so that the output is strict JSON."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer requests and levels (< 1 min)")
    p.add_argument("--n", type=int, default=None, help="measured requests per path in (a) (default 400; quick 60)")
    p.add_argument("--model", default=None, help="checkpoint directory (default: a tiny random-weight model)")
    p.add_argument("--profile", action="store_true", help="also run the coordinator under cProfile")
    p.add_argument("--profile-s", type=float, default=5.0, help="seconds of profiled load")
    p.add_argument("--reps", type=int, default=None, help="interleaved rounds of (b) (default 3; quick 2)")
    p.add_argument("--event-loop", default="auto", choices=("auto", "asyncio", "uvloop"),
                   help="the servers' event loop (default auto: uvloop where installed)")
    p.add_argument("--http-protocol", default="auto", choices=("auto", "h11", "httptools"),
                   help="the servers' HTTP parser (default auto: httptools where installed)")
    p.add_argument("--save-json", default=None)
    args = p.parse_args(argv)
    result = finite(run(args))
    if args.save_json:
        Path(args.save_json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, allow_nan=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
