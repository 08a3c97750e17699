"""Shared pieces of the engine benchmarks: the benchmark checkpoint, trace lengths, and the
virtual-clock driver that runs an `LLMEngine` on emulated 910B time; and of the front-door
benchmarks: closed-loop load generation over keep-alive HTTP/1.1 with the CPU of the processes
served (end of the file).

The virtual clock
-----------------
The emulated card's clock is the one the device figures are measured on. It advances by the
emulated duration of every engine step (`engine.device.pacer.emulated_time_s` is their sum) and
jumps forward over idle gaps. A request is handed to the engine only once the clock has reached its
arrival; when the engine has nothing to do, the clock jumps to the next arrival. A request's emulated
TTFT is the clock at the end of the step that produced its first token minus its arrival.

Admission is a policy: `admit_all` is what a serving front end does (continuous batching; the
engine's own scheduler decides what runs); a benchmark can pass another policy (static batching
admits a new batch only when the engine is empty).
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from mindmotor import SamplingParams
from mindmotor.common.bundled_data import AZURE_TRACE
from mindmotor.engine.llm_engine import LLMEngine

REPO_ROOT = Path(__file__).resolve().parents[1]
# The trace ships inside the package (services/mindmotor/assets/data/), so a plain clone runs these.
DEFAULT_TRACE = AZURE_TRACE
TRACE_CITATION = ("Azure LLM inference trace 2023, conversation part (Azure/AzurePublicDataset "
                  "AzureLLMInferenceTrace_conv, as processed in microsoft/vidur); CC-BY; Patel et al., "
                  "\"Splitwise: Efficient Generative LLM Inference Using Phase Splitting\", ISCA 2024")

# The demo model's shape (random weights): what the benchmarks run unless --model is given.
DEMO_SHAPE = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096)


# ---- model -------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def benchmark_checkpoint(model: str | None = None, seed: int = 0) -> str:
    """`model` if given, else a random-weight checkpoint of the demo shape in a temp dir (once per
    process and seed)."""
    if model:
        return str(model)
    from mindmotor.model.testing import write_tiny_checkpoint
    directory = Path(tempfile.mkdtemp(prefix="mindmotor-bench-")) / "demo-shape"
    write_tiny_checkpoint(directory, seed=seed, **DEMO_SHAPE)
    return str(directory)


def describe_model(engine: LLMEngine, model_arg: str | None) -> dict:
    c = engine.model.config
    return {"weights": model_arg or "random (write_tiny_checkpoint, demo-model shape)",
            "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads, "vocab_size": c.vocab_size,
            "emulated_profile": engine.device.profile.name, "device": engine.device.spec.name,
            "kv_blocks": engine.block_manager.num_blocks, "block_size": engine.block_manager.block_size,
            "max_model_len": engine.max_model_len,
            "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default")}


# ---- requests ----------------------------------------------------------------------------------
@dataclass
class BenchRequest:
    request_id: str
    prompt_token_ids: list[int]
    output_len: int                 # tokens the engine generates (ignore_eos, max_tokens = this)
    arrival_s: float = 0.0          # on the emulated clock
    declared_max_tokens: int | None = None  # what the client asked for (static batching reserves it)
    lora: str | None = None         # the LoRA adapter it names (None: the base model)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    def params(self) -> SamplingParams:
        return SamplingParams(max_tokens=self.output_len, temperature=0.0, ignore_eos=True)


def random_tokens(rng: np.random.Generator, vocab_size: int, n: int) -> list[int]:
    return rng.integers(0, vocab_size, size=n).tolist()


def load_trace(path: Path | str = DEFAULT_TRACE) -> np.ndarray:
    """The trace as an array [rows, 3]: arrived_at, prompt tokens, output tokens."""
    with open(path, newline="") as f:
        rows = [(float(r["arrived_at"]), int(r["num_prefill_tokens"]), int(r["num_decode_tokens"]))
                for r in csv.DictReader(f)]
    return np.asarray(rows, dtype=np.float64)


def sample_trace_lengths(rng: np.random.Generator, n: int, max_model_len: int, *,
                         max_output: int = 1024, trace: Path | str = DEFAULT_TRACE
                         ) -> list[tuple[int, int]]:
    """`n` (prompt, output) pairs drawn from the trace rows (with replacement), clipped to fit:
    output ≤ max_output, prompt ≤ max_model_len - max_output (so prompt + any output fits)."""
    rows = load_trace(trace)
    idx = rng.integers(0, len(rows), size=n)
    max_prompt = max_model_len - max_output
    out = []
    for i in idx:
        p = int(min(max(rows[i, 1], 1), max_prompt))
        o = int(min(max(rows[i, 2], 1), max_output))
        out.append((p, o))
    return out


def poisson_arrivals(rng: np.random.Generator, n: int, rate_per_s: float) -> list[float]:
    return np.cumsum(rng.exponential(1.0 / rate_per_s, size=n)).tolist()


# ---- the virtual clock driver ------------------------------------------------------------------
@dataclass
class RequestRecord:
    request_id: str
    arrival_s: float
    prompt_len: int
    output_len: int
    admitted_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int = 0

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s


def step_without_model(engine: LLMEngine):
    """One engine step minus the numpy forward pass and the sampler: schedule, build the step's
    inputs (which gives the `StepShape` the device charges for), postprocess with a placeholder
    token, price the step on the emulated device. With `ignore_eos` and fixed `max_tokens` the
    token values never change what is scheduled, so the emulated time is exactly that of
    `engine.step()` (tests/benchmarks checks this); the host does not run the model.
    Returns (outputs, shape)."""
    started = time.monotonic()
    sched = engine.scheduler.schedule()
    if sched.empty:
        return [], None
    engine._account_step(sched, engine.clock())    # as engine.step(): first steps, tokens per step
    inp = engine.runner.prepare(sched)
    n = len(inp.sampling)
    outputs = engine._postprocess(sched, inp.sampling, [PLACEHOLDER_TOKEN] * n, [None] * n)
    engine.device.run_step(inp.shape, started)
    engine.steps += 1
    return outputs, inp.shape


PLACEHOLDER_TOKEN = 1


class _ShapeTap:
    """Remembers the `StepShape` of the last step `engine.step()` priced (wraps the instance's
    `device.run_step`; the engine code is untouched)."""

    def __init__(self, engine: LLMEngine):
        self.shape = None
        device = engine.device
        inner = device.run_step

        def run_step(shape, host_started_at):
            self.shape = shape
            return inner(shape, host_started_at)
        device.run_step = run_step


# policy(engine, ready) -> how many of the first `ready` requests to hand to the engine now
AdmitPolicy = Callable[[LLMEngine, list[BenchRequest]], int]


def admit_all(engine: LLMEngine, ready: list[BenchRequest]) -> int:
    return len(ready)


@dataclass
class DriverResult:
    records: list[RequestRecord]
    emulated_busy_s: float          # sum of emulated step times
    emulated_makespan_s: float      # clock at the end (busy + idle gaps)
    wall_s: float                   # host time of the whole run
    steps: int
    batch_sizes: list[int] = field(default_factory=list)   # per admission (static batching)
    step_num_seqs: list[int] = field(default_factory=list)  # sequences per step

    @property
    def output_tokens(self) -> int:
        return sum(r.num_output_tokens for r in self.records)


class VirtualClockDriver:
    """Feeds requests to an engine by their emulated arrival times and steps it to completion."""

    def __init__(self, engine: LLMEngine, requests: list[BenchRequest],
                 admit: AdmitPolicy = admit_all, progress: bool = True, desc: str = "",
                 check_invariants_every: int = 0, run_model: bool = True,
                 on_step: Callable | None = None):
        """run_model=False steps with `step_without_model` (emulated figures only, fast).
        on_step(shape, outputs, driver) is called after every step that did work."""
        self.engine = engine
        self.run_model = run_model
        self.on_step = on_step
        self._tap = _ShapeTap(engine) if run_model and on_step is not None else None
        self.pending = sorted(requests, key=lambda r: r.arrival_s)
        self.admit = admit
        self.progress = progress
        self.desc = desc
        self.check_every = check_invariants_every
        self.records = {r.request_id: RequestRecord(r.request_id, r.arrival_s, r.prompt_len, r.output_len)
                        for r in requests}
        self.idle_s = 0.0                     # emulated time jumped over while the engine was idle
        self._base_emulated = engine.device.pacer.emulated_time_s

    @property
    def now(self) -> float:
        return self.engine.device.pacer.emulated_time_s - self._base_emulated + self.idle_s

    def run(self) -> DriverResult:
        eng = self.engine
        total_tokens = sum(r.output_len for r in self.pending)
        bar = _progress_bar(total_tokens, self.desc) if self.progress else None
        next_i = 0
        ready: list[BenchRequest] = []
        batch_sizes, step_num_seqs = [], []
        steps = 0
        started = time.perf_counter()
        while next_i < len(self.pending) or ready or eng.has_unfinished_requests():
            now = self.now
            while next_i < len(self.pending) and self.pending[next_i].arrival_s <= now:
                ready.append(self.pending[next_i])
                next_i += 1
            if ready:
                k = self.admit(eng, ready)
                if k:
                    for req in ready[:k]:
                        eng.add_request(req.request_id, req.prompt_token_ids, req.params(),
                                        arrival_time=req.arrival_s, **({"lora": req.lora} if req.lora else {}))
                        self.records[req.request_id].admitted_s = now
                    batch_sizes.append(k)
                    del ready[:k]
            if not eng.has_unfinished_requests():
                if ready:
                    raise RuntimeError("the admission policy admitted nothing to an idle engine")
                if next_i < len(self.pending):       # idle: jump to the next arrival
                    self.idle_s += self.pending[next_i].arrival_s - now
                    continue
                break
            before = eng.device.pacer.emulated_time_s
            if self.run_model:
                outputs = eng.step()
                shape = self._tap.shape if self._tap is not None else None
            else:
                outputs, shape = step_without_model(eng)
            if not outputs and eng.device.pacer.emulated_time_s == before:
                # nothing could be scheduled (e.g. a prompt larger than the free KV pool)
                if next_i < len(self.pending):
                    self.idle_s += max(0.0, self.pending[next_i].arrival_s - now)
                    continue
                raise RuntimeError("the engine has unfinished requests but schedules nothing")
            steps += 1
            step_num_seqs.append(len(outputs))
            end = self.now
            for out in outputs:
                rec = self.records[out.request_id]
                if rec.first_token_s is None and out.new_token_ids:
                    rec.first_token_s = end
                    rec.num_cached_tokens = out.num_cached_tokens
                rec.num_output_tokens += len(out.new_token_ids)
                if out.finished:
                    rec.finished_s = end
            if self.on_step is not None:
                self.on_step(shape, outputs, self)
            if bar is not None:
                bar.update(sum(len(o.new_token_ids) for o in outputs))
            if self.check_every and steps % self.check_every == 0:
                eng.check_invariants()
        wall = time.perf_counter() - started
        if bar is not None:
            bar.close()
        records = list(self.records.values())
        unfinished = [r.request_id for r in records if r.finished_s is None]
        if unfinished:
            raise RuntimeError(f"{len(unfinished)} requests did not finish, e.g. {unfinished[:3]}")
        return DriverResult(records=records,
                            emulated_busy_s=eng.device.pacer.emulated_time_s - self._base_emulated,
                            emulated_makespan_s=self.now, wall_s=wall, steps=steps,
                            batch_sizes=batch_sizes, step_num_seqs=step_num_seqs)


def _progress_bar(total: int, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        return None
    return tqdm(total=total, desc=desc, unit="tok", file=sys.stderr, mininterval=2.0,
                disable=None, leave=False)


# ---- statistics and output ---------------------------------------------------------------------
def percentile(values, q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else math.nan


def mean(values) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a small run (under a minute)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None,
                        help="checkpoint directory (default: random weights of the demo-model shape)")
    parser.add_argument("--save-json", default=None, metavar="PATH", help="also write the result here")


def finish(result: dict, save_json: str | None) -> None:
    """Print the result as ONE JSON line (the last line of stdout) and optionally save it."""
    text = json.dumps(result, sort_keys=False, default=_json_default)
    if save_json:
        Path(save_json).parent.mkdir(parents=True, exist_ok=True)
        Path(save_json).write_text(json.dumps(result, indent=2, default=_json_default) + "\n")
    print(text, flush=True)


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if hasattr(o, "__dataclass_fields__"):
        return asdict(o)
    raise TypeError(f"not JSON serializable: {type(o)}")


def r3(x: float) -> float:
    return round(float(x), 3)


def r4(x: float) -> float:
    return round(float(x), 4)


# ---- load generation against a served API (closed loop, keep-alive HTTP/1.1) --------------------
# What the front-door benchmarks share (front_door_scale.py, up_throughput.py): a small hand-written
# HTTP/1.1 client on asyncio (much cheaper per request than httpx, so that a 2-core host's client
# is not what saturates), a closed-loop driver, a sweep over concurrency that stops where the rate
# stops rising, and the CPU time of server processes (and their descendants) from /proc.
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
SHORT_PROMPT_IDS = [11, 12, 13, 14, 15, 16, 17, 18]


def _proc_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of a live process, None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def process_tree(root: int) -> list[int]:
    """`root` and its live descendants (from /proc: every process's parent)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _proc_stat(int(entry))
            if stat is not None:
                children.setdefault(stat[0], []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def proc_cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def cpu_s(pids) -> float:
    """Sum of user + system CPU seconds of the live processes among `pids`."""
    return sum(s[1] for s in (_proc_stat(p) for p in pids) if s is not None)


def completion_body(model: str, max_tokens: int = 1, prompt=SHORT_PROMPT_IDS) -> bytes:
    """A short greedy non-streamed `/v1/completions` body (token-id prompt, `ignore_eos`)."""
    return json.dumps({"model": model, "prompt": list(prompt), "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True}).encode()


class HTTPConnection:
    """One keep-alive HTTP/1.1 connection on asyncio streams. Enough for JSON request/response:
    Content-Length or chunked response bodies."""

    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None):
        self.host, self.port = host, port
        self.extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.reader = None
        self.writer = None

    async def connect(self) -> None:
        import asyncio
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.writer = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            await self.connect()
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{self.extra}"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        header = await self.reader.readuntil(b"\r\n\r\n")
        lines = header.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if "content-length" in headers:
            data = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                parts.append(chunk[:-2])
            data = b"".join(parts)
        else:
            data = await self.reader.read()
            self.close()
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, data


async def closed_loop(host: str, port: int, path: str, body: bytes, concurrency: int, duration_s: float,
                      warmup_s: float, method: str = "POST", headers: dict[str, str] | None = None) -> dict:
    """`concurrency` keep-alive connections, each sending its next request as soon as the previous
    answer arrives, for warmup_s + duration_s; rate and latency over the measured part only (a
    request counts if it finished inside it; non-200 answers and connection errors are counted
    under `errors`)."""
    import asyncio

    conns = [HTTPConnection(host, port, headers) for _ in range(concurrency)]
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
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                conn.close()
                await asyncio.sleep(0.01)
                continue
            done = time.perf_counter()
            if measure_from <= done < stop_at:
                if status == 200:
                    latencies.append(done - t)
                else:
                    errors[f"http_{status}"] = errors.get(f"http_{status}", 0) + 1

    await asyncio.gather(*(loop(c) for c in conns))
    for c in conns:
        c.close()
    ms = np.asarray(latencies) * 1000.0
    return {"concurrency": concurrency, "requests": len(latencies), "rps": len(latencies) / duration_s,
            "p50_ms": float(np.percentile(ms, 50)) if len(ms) else math.nan,
            "p99_ms": float(np.percentile(ms, 99)) if len(ms) else math.nan, "errors": errors}


def measure_level(host: str, port: int, path: str, body: bytes, concurrency: int, duration_s: float,
                  warmup_s: float, cpu: dict[str, Callable[[], float]] | None = None,
                  headers: dict[str, str] | None = None) -> dict:
    """One closed-loop level (`closed_loop`, its own event loop) plus, per name in `cpu` (a callable
    giving CPU seconds so far), the cores it used over the level (`cpu_cores`) and its CPU
    milliseconds per completed request (`cpu_ms_per_request`; warmup's CPU included, so slightly
    high); the client (this process) under "client"."""
    import asyncio

    cpu = cpu or {}
    cpu0 = {k: f() for k, f in cpu.items()}
    client0, wall0 = time.process_time(), time.perf_counter()
    row = asyncio.run(closed_loop(host, port, path, body, concurrency, duration_s, warmup_s, headers=headers))
    wall = time.perf_counter() - wall0
    row["cpu_cores"] = {k: round((f() - cpu0[k]) / wall, 3) for k, f in cpu.items()}
    row["cpu_cores"]["client"] = round((time.process_time() - client0) / wall, 3)
    done = row["rps"] * wall
    row["cpu_ms_per_request"] = {k: round(v * wall * 1000 / done, 3) if done else None
                                 for k, v in row["cpu_cores"].items()}
    return row


def sweep_levels(name: str, host: str, port: int, path: str, body: bytes, levels: list[int], duration_s: float,
                 warmup_s: float, cpu: dict[str, Callable[[], float]] | None = None,
                 headers: dict[str, str] | None = None, min_stop_concurrency: int = 16,
                 logger: Callable[[str], None] = log) -> dict:
    """`measure_level` at each concurrency in `levels` until the rate stops rising (two levels in a
    row < 5 % above the best, not before `min_stop_concurrency`: on a shared host one level can
    dip). Returns the levels and the peak (`max_rps`, its concurrency, p50 and p99)."""
    rows, best, flat = [], 0.0, 0
    for c in levels:
        row = measure_level(host, port, path, body, c, duration_s, warmup_s, cpu, headers)
        rows.append(row)
        logger(f"  {name} C={c:<4} {row['rps']:8.1f} req/s  p50 {row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms"
               f"  cpu {row['cpu_cores']}" + (f"  errors {row['errors']}" if row["errors"] else ""))
        flat = 0 if row["rps"] > best * 1.05 else flat + 1
        best = max(best, row["rps"])
        if flat >= 2 and c >= min_stop_concurrency:
            break
    peak = max(rows, key=lambda r: r["rps"])
    return {"levels": rows, "max_rps": peak["rps"], "at_concurrency": peak["concurrency"],
            "p50_ms_at_max": peak["p50_ms"], "p99_ms_at_max": peak["p99_ms"]}


def best_under_p99(levels: list[dict], p99_ms: float) -> dict | None:
    """The level with the highest rate whose p99 is under `p99_ms` and that had no error."""
    ok = [r for r in levels if r["p99_ms"] < p99_ms and not r["errors"]]
    return max(ok, key=lambda r: r["rps"]) if ok else None


def strict_json(obj):
    """NaN (no measurement) -> None, recursively, so that the output is strict JSON."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def sweep_interleaved(targets: dict[str, tuple[str, int, dict[str, Callable[[], float]]]], path: str, body: bytes,
                      levels: list[int], duration_s: float, warmup_s: float, headers: dict[str, str] | None = None,
                      min_stop_concurrency: int = 16, logger: Callable[[str], None] = log) -> dict[str, dict]:
    """`sweep_levels` over several servers at once, alternating them at every level (name ->
    (host, port, cpu callables)), so that each level of each sees the same background load: on a
    shared host a load that changes between two sequential sweeps would otherwise decide their
    ratio. Stops when every server's rate has stopped rising (as `sweep_levels`)."""
    rows: dict[str, list[dict]] = {name: [] for name in targets}
    best = {name: 0.0 for name in targets}
    flat = {name: 0 for name in targets}
    for c in levels:
        for name, (host, port, cpu) in targets.items():
            row = measure_level(host, port, path, body, c, duration_s, warmup_s, cpu, headers)
            rows[name].append(row)
            logger(f"  {name} C={c:<4} {row['rps']:8.1f} req/s  p50 {row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms"
                   f"  cpu {row['cpu_cores']}" + (f"  errors {row['errors']}" if row["errors"] else ""))
            flat[name] = 0 if row["rps"] > best[name] * 1.05 else flat[name] + 1
            best[name] = max(best[name], row["rps"])
        if all(f >= 2 for f in flat.values()) and c >= min_stop_concurrency:
            break
    out = {}
    for name, levels_done in rows.items():
        peak = max(levels_done, key=lambda r: r["rps"])
        out[name] = {"levels": levels_done, "max_rps": peak["rps"], "at_concurrency": peak["concurrency"],
                     "p50_ms_at_max": peak["p50_ms"], "p99_ms_at_max": peak["p99_ms"]}
    return out
