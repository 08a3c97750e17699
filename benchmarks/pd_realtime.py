"""The realtime variant of `pd_split.py`: real processes on this machine, one run per cluster.

Per cluster: four `mindmotor worker --emulate qwen2-7b --timing realtime` processes (each step
takes the emulated 910B3 time, or longer when the host is slower: that excess is the host lag)
and one `mindmotor coordinator --worker ADDR ...` (it reads each worker's role from its Status and
splits prefill/decode when both roles are there); the client streams completions over HTTP with
`loadtest/bench_serving.send_request`, the same requests at the same offsets for every cluster.

  mixed          4 × `--role mixed --no-chunked-prefill --max-num-batched-tokens 8192`
  mixed_chunked  4 × `--role mixed --max-num-batched-tokens CHUNK`
  split          2 × `--role prefill --no-chunked-prefill`, 2 × `--role decode`; one `--node`

TTFT and TPOT are what the client sees (TTFT: request sent → first text chunk; TPOT: (end − TTFT) /
(tokens − 1)). Host lag per worker: the growth of Status `load.lag_time_s` (=
`mindmotor_host_lag_seconds_total`) over the run, against the emulated busy time of the same
steps; and how late the client's own event loop woke up (the coordinator's stalls are not
measured separately: they show only as client TTFT above the workers' logged `ttft_s`). The served
checkpoint only has to be cheap for the host (the emulated profile prices every
step as qwen2-7b): by default a tiny random-weight Llama.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:     # `python benchmarks/<this>.py` from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import BenchRequest, log, percentile, r3, r4  # noqa: E402
from loadtest.bench_serving import RequestResult, send_request  # noqa: E402
from mindmotor.protocol import worker_pb2, worker_pb2_grpc  # noqa: E402
from mindmotor.runtime.child_process import ChildProcess  # noqa: E402

PROFILE = "qwen2-7b"
DEVICE = "910B3"
HOST_BOUND_SHARE = 0.05          # host lag above 5% of the emulated busy time: the figures are host-bound


def host_checkpoint(seed: int) -> str:
    """A tiny random-weight Llama with room for 2,200 + 220 tokens, as cheap on the host as it can
    be: a 2,000-token prefill costs O(heads x layers x T^2) element-wise softmax work in numpy, so
    one layer with two query heads (one KV head) keeps it well under the emulated 0.14 s."""
    from mindmotor.model.testing import write_tiny_checkpoint

    directory = Path(tempfile.mkdtemp(prefix="mindmotor-pd-rt-")) / "tiny-host-model"
    write_tiny_checkpoint(directory, seed=seed, vocab_size=512, max_position_embeddings=4096,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    return str(directory)


def worker_roles(kind: str, chunk_tokens: int) -> list[tuple[str, list[str]]]:
    """(role, engine flags) of each of the four workers of a cluster."""
    whole = ["--no-chunked-prefill", "--max-num-batched-tokens", "8192"]
    if kind == "mixed":
        return [("mixed", whole)] * 4
    if kind == "mixed_chunked":
        return [("mixed", ["--max-num-batched-tokens", str(chunk_tokens)])] * 4
    return [("prefill", whole)] * 2 + [("decode", ["--max-num-batched-tokens", "8192"])] * 2


@dataclass
class Cluster:
    kind: str
    workers: list[ChildProcess]
    addresses: list[str]
    coordinator: ChildProcess
    url: str

    def statuses(self) -> list[worker_pb2.StatusResponse]:
        out = []
        for address in self.addresses:
            with grpc.insecure_channel(address) as channel:
                out.append(worker_pb2_grpc.WorkerStub(channel).Status(worker_pb2.StatusRequest(), timeout=10))
        return out

    def stop(self) -> None:
        self.coordinator.stop(30)
        for worker in self.workers:
            worker.signal()
        for worker in self.workers:
            worker.stop(30)


def start_cluster(kind: str, model_dir: str, log_dir: Path, chunk_tokens: int, seed: int) -> Cluster:
    workers = []
    for i, (role, flags) in enumerate(worker_roles(kind, chunk_tokens)):
        args = ["worker", "--model", model_dir, "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
                "--device", DEVICE, "--emulate", PROFILE, "--timing", "realtime", "--role", role,
                "--node", "bench-node", "--worker-id", f"{kind}-{role}-{i}", "--seed", str(seed),
                "--log-level", "DEBUG", *flags]          # "request finished" per request (sim_vs_realtime.py reads it)
        workers.append(ChildProcess(f"{kind}-{i}", args, "MINDMOTOR_WORKER_READY", log_dir / f"{kind}-worker-{i}.log"))
    try:
        addresses = [f"127.0.0.1:{w.wait_ready(120)['port']}" for w in workers]
        args = ["coordinator", "--host", "127.0.0.1", "--port", "0", "--policy", "least_load",
                "--model", f"{Path(model_dir).name}={model_dir}", "--access-log"]   # every request's line
        for address in addresses:
            args += ["--worker", address]
        coordinator = ChildProcess(f"{kind}-coordinator", args, "MINDMOTOR_COORDINATOR_READY",
                                   log_dir / f"{kind}-coordinator.log")
        url = f"http://127.0.0.1:{coordinator.wait_ready(60)['port']}"
    except BaseException:
        for w in workers:
            w.kill()
        raise
    cluster = Cluster(kind, workers, addresses, coordinator, url)
    wait_routable(cluster.url, len(workers))
    return cluster


def wait_routable(url: str, expected: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            instances = httpx.get(url + "/health", timeout=2).json().get("instances", {})
            if sum(1 for i in instances.values() if i.get("routable")) >= expected:
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the coordinator at {url} did not see {expected} routable workers")


def body(model: str, request: BenchRequest) -> dict:
    """Streaming, greedy, with `logprobs` 0 so that every token arrives in a chunk: the random
    model often opens with bytes that are not yet a whole UTF-8 character, whose text the server
    holds back — timed by text, such a request's TTFT ran up to 1.4 s late."""
    return {"model": model, "prompt": request.prompt_token_ids, "max_tokens": request.output_len,
            "ignore_eos": True, "temperature": 0.0, "logprobs": 0, "stream": True,
            "stream_options": {"include_usage": True}}


async def watch_loop(delays: list[float], tick_s: float = 0.01) -> None:
    """How late the client's event loop wakes up (a stalled client inflates TTFT as well)."""
    while True:
        before = time.perf_counter()
        await asyncio.sleep(tick_s)
        delays.append(time.perf_counter() - before - tick_s)


async def drive(url: str, model: str, requests: list[BenchRequest], bar=None
                ) -> tuple[list[RequestResult], float, list[float]]:
    """Send every request at its arrival offset (open loop); (results, wall seconds, client loop delays)."""
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600.0, connect=30.0)) as client:
        warm = BenchRequest("warmup", requests[0].prompt_token_ids, 4)
        await send_request(client, url + "/v1/completions", {}, body(model, warm), False, time.perf_counter(),
                           RequestResult())
        results = [RequestResult(prompt_len=len(r.prompt_token_ids), output_len=r.output_len) for r in requests]

        async def one(i: int) -> None:
            await send_request(client, url + "/v1/completions", {}, body(model, requests[i]), False, t0, results[i])
            if bar is not None:
                bar.update(1)

        delays: list[float] = []
        watcher = asyncio.create_task(watch_loop(delays))
        t0 = time.perf_counter()
        tasks = []
        for i, request in enumerate(requests):
            delay = t0 + request.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
        watcher.cancel()
        return results, time.perf_counter() - t0, delays


def host_lag(before: list, after: list, wall_s: float) -> dict:
    """Per worker: host lag and emulated busy time accumulated during the run."""
    workers = []
    for b, a in zip(before, after):
        lag = a.load.lag_time_s - b.load.lag_time_s
        busy = a.load.emulated_time_s - b.load.emulated_time_s
        workers.append({"worker": a.worker_id, "role": a.role, "lag_s": r3(lag), "emulated_busy_s": r3(busy),
                        "lag_share": r3(lag / busy) if busy > 0 else 0.0})
    lag = sum(w["lag_s"] for w in workers)
    busy = sum(w["emulated_busy_s"] for w in workers)
    share = lag / busy if busy > 0 else 0.0
    return {"host_lag_s": r3(lag), "emulated_busy_s": r3(busy), "host_lag_share": r3(share),
            "host_lag_per_wall_s": r3(lag / wall_s), "host_bound": share > HOST_BOUND_SHARE, "workers": workers}


def summarize(results: list[RequestResult], wall_s: float, lag: dict, loop_delays: list[float]) -> dict:
    ok = [r for r in results if r.success]
    ttft = [r.ttft_s for r in ok]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    return {"ttft_p50_s": r4(percentile(ttft, 50)), "ttft_p90_s": r4(percentile(ttft, 90)),
            "ttft_p99_s": r4(percentile(ttft, 99)), "tpot_p50_s": r4(percentile(tpot, 50)),
            "tpot_p90_s": r4(percentile(tpot, 90)), "tpot_p99_s": r4(percentile(tpot, 99)),
            "throughput_tok_s": r3(sum(r.output_tokens or 0 for r in ok) / wall_s), "wall_s": r3(wall_s),
            "completed": len(ok), "failed": len(results) - len(ok),
            "errors": sorted({r.error for r in results if not r.success}), **lag,
            "client_loop_delay_p99_s": r4(percentile(loop_delays, 99)),
            "client_loop_delay_max_s": r4(max(loop_delays, default=0.0)),
            "ttft_s": [r4(x) for x in ttft], "tpot_s": [r4(x) for x in tpot]}


def progress_bar(total: int, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        return None
    return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, mininterval=2.0, disable=None, leave=False)


def run_cluster(kind: str, model_dir: str, requests: list[BenchRequest], log_dir: Path, chunk_tokens: int,
                seed: int) -> dict:
    started = time.perf_counter()
    cluster = start_cluster(kind, model_dir, log_dir, chunk_tokens, seed)
    log(f"  {kind}: 4 workers + coordinator up in {time.perf_counter() - started:.1f} s; sending {len(requests)} "
        f"requests")
    try:
        before = cluster.statuses()
        bar = progress_bar(len(requests), kind)
        results, wall, delays = asyncio.run(drive(cluster.url, Path(model_dir).name, requests, bar))
        if bar is not None:
            bar.close()
        after = cluster.statuses()
    finally:
        cluster.stop()
    return summarize(results, wall, host_lag(before, after, wall), delays)


def run(model_dir: str | None, requests: list[BenchRequest], chunk_tokens: int, seed: int) -> dict:
    """The three clusters in turn; {kind: summary}."""
    model_dir = model_dir or host_checkpoint(seed)
    log_dir = Path(tempfile.mkdtemp(prefix="mindmotor-pd-rt-logs-"))
    log(f"  realtime: logs in {log_dir}")
    runs = {}
    for kind in ("mixed", "mixed_chunked", "split"):
        runs[kind] = run_cluster(kind, model_dir, requests, log_dir, chunk_tokens, seed)
        brief = {k: v for k, v in runs[kind].items() if k not in ("ttft_s", "tpot_s", "workers")}
        log(f"  {kind:14s} {brief}")
        log(f"  {kind:14s} host lag per worker: {runs[kind]['workers']}")
    return runs
