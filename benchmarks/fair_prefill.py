"""Fair prefill: how long does a concurrent long prompt hold back other requests' tokens?

Short streams (`--streams` greedy requests of 64-token prompts) against a real `mindmotor worker`
process over gRPC, realtime timing (a step takes its emulated time, or its host time when that is
longer), are measured alone and then with one concurrent long prompt (`--long-tokens`, 8,192 by
default), in two worker configurations started one after the other in the same run:

  before   the worker's engine settings before fair prefill: no prefill attention budget
           (`--max-num-batched-attention 0`): a step takes up to `--max-num-batched-tokens` 8,192
           tokens, so the long prompt is prefilled in one or two steps while every stream waits
  after    the worker's defaults: decodes first, and a step's prefill attention bounded
           (`--max-num-batched-attention auto`), so the long prompt is prefilled in many short steps

Inter-token latency (ITL) is the gap between two consecutive chunks of a stream as the client sees
them (each chunk carries the tokens of one engine step). Alone: every gap in a `--window`-second
window; with the long prompt: every gap that overlaps the time from sending it to its first token.

The served model has the bundled model's shape (8 query heads, 2 KV heads, 4 layers, hidden 256;
random weights) with a 16,384-token context: the bundled checkpoint's context is 4,096 tokens, too
short for an 8k prompt. Per token it costs the host what the bundled model costs. The emulated
profile is that shape too (what `mindmotor up` serves), unless `--emulate PROFILE`.

`stall_bound_ms` is one step's budget, measured: the same long prompt beside the same number of
decoding sequences through an in-process `LLMEngine` with the after configuration (parsed from the
same worker flags), every step timed — host, and emulated: a realtime step takes the longer. Every
step of that prefill is budget-bound, so their p99 is what the streams' ITL p99 compares with
(their p50 and max are reported too). On a shared machine every host figure moves with its load:
the 1-minute load average is reported at the start and the end.

    .venv/bin/python benchmarks/fair_prefill.py --quick      # ~1-2 minutes
    .venv/bin/python benchmarks/fair_prefill.py              # longer windows, 3 long prompts

Progress on stderr; ONE JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # also for the worker processes (inherited)

import grpc  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import DEMO_SHAPE, finish, log, percentile, r3  # noqa: E402
from mindmotor.model.config import LlamaConfig  # noqa: E402
from mindmotor.protocol import worker_pb2 as pb  # noqa: E402
from mindmotor.protocol import worker_pb2_grpc  # noqa: E402
from mindmotor.runtime.child_process import ChildProcess  # noqa: E402

CONTEXT = 16384
SHORT_PROMPT_TOKENS = 64
BEFORE_FLAGS = ["--max-num-batched-attention", "0"]     # the worker's step before fair prefill


def long_context_checkpoint(seed: int) -> str:
    """The bundled model's shape, random weights, a 16,384-token context."""
    from mindmotor.model.testing import write_tiny_checkpoint

    directory = Path(tempfile.mkdtemp(prefix="mindmotor-fair-prefill-")) / "demo-shape-16k"
    write_tiny_checkpoint(directory, seed=seed, **{**DEMO_SHAPE, "max_position_embeddings": CONTEXT})
    return str(directory)


def request(prompt: list[int], max_tokens: int) -> pb.GenerateRequest:
    req = pb.GenerateRequest(sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    req.prompt_token_ids.ids.extend(prompt)
    return req


@dataclass
class Phase:
    """One measurement: the short streams' chunks (arrival time, tokens), the window, the long
    prompt's TTFT."""
    arrivals: list[list[tuple[float, int]]] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0
    long_ttft_s: float | None = None
    long_tokens: int = 0

    def gaps_ms(self) -> list[float]:
        """Gaps between consecutive chunks of a stream that overlap the window."""
        out = []
        for chunks in self.arrivals:
            times = [t for t, _ in chunks]
            out += [(b - a) * 1e3 for a, b in zip(times, times[1:]) if b >= self.start and a <= self.end]
        return out

    def stream_tokens(self) -> int:
        return sum(n for chunks in self.arrivals for t, n in chunks if self.start <= t <= self.end)

    def summary(self) -> dict:
        gaps = self.gaps_ms()
        wall = self.end - self.start
        return {"itl_p50_ms": r3(percentile(gaps, 50)), "itl_p99_ms": r3(percentile(gaps, 99)),
                "itl_max_ms": r3(max(gaps, default=float("nan"))), "gaps": len(gaps), "window_s": r3(wall),
                "stream_tokens_per_s": r3(self.stream_tokens() / wall),
                "tokens_per_s": r3((self.stream_tokens() + self.long_tokens) / wall),
                **({"long_ttft_s": r3(self.long_ttft_s)} if self.long_ttft_s is not None else {})}


async def _stream(stub, prompt: list[int], chunks: list[tuple[float, int]]) -> None:
    call = stub.Generate(request(prompt, CONTEXT - len(prompt) - 1), timeout=600)
    try:
        async for chunk in call:
            if chunk.token_ids:
                chunks.append((time.perf_counter(), len(chunk.token_ids)))
    finally:
        call.cancel()


async def measure(address: str, prompts: list[list[int]], long_prompt: list[int] | None, window_s: float) -> Phase:
    """Start the streams; once each has two chunks, measure for `window_s` or until the long
    prompt's first token; then cancel the streams (the worker aborts them)."""
    phase = Phase(arrivals=[[] for _ in prompts])
    async with grpc.aio.insecure_channel(address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        tasks = [asyncio.create_task(_stream(stub, p, t)) for p, t in zip(prompts, phase.arrivals)]
        try:
            deadline = time.perf_counter() + 60
            while min(len(t) for t in phase.arrivals) < 2:
                failed = [t for t in tasks if t.done()]
                if failed:
                    failed[0].result()                       # raises what ended it
                if time.perf_counter() > deadline or failed:
                    raise RuntimeError("the short streams did not start")
                await asyncio.sleep(0.005)
            phase.start = time.perf_counter()
            if long_prompt is None:
                await asyncio.sleep(window_s)
            else:
                async for chunk in stub.Generate(request(long_prompt, 1), timeout=600):
                    if chunk.token_ids and phase.long_ttft_s is None:
                        phase.long_ttft_s = time.perf_counter() - phase.start
                phase.long_tokens = len(long_prompt)
            phase.end = time.perf_counter()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return phase


def start_worker(name: str, model_dir: str, flags: list[str], emulate: str | None, log_dir: Path) -> ChildProcess:
    args = ["worker", "--model", model_dir, "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
            "--timing", "realtime", "--worker-id", f"fair-prefill-{name}",
            *(["--emulate", emulate] if emulate else []), *flags]
    return ChildProcess(name, args, "MINDMOTOR_WORKER_READY", log_dir / f"{name}.log")


def run_config(name: str, flags: list[str], model_dir: str, emulate: str | None, prompts, long_prompts,
               window_s: float, log_dir: Path) -> dict:
    worker = start_worker(name, model_dir, flags, emulate, log_dir)
    try:
        address = f"127.0.0.1:{worker.wait_ready(120)['port']}"
        asyncio.run(measure(address, prompts[:1], None, 0.2))                 # warm-up
        alone = asyncio.run(measure(address, prompts, None, window_s))
        log(f"  {name}: alone     {alone.summary()}")
        with_long = []
        for long_prompt in long_prompts:
            phase = asyncio.run(measure(address, prompts, long_prompt, window_s))
            log(f"  {name}: with long {phase.summary()}")
            with_long.append(phase)
    finally:
        worker.stop(30)
    return {"alone": alone.summary(), "with_long": _merge(with_long)}


def _merge(phases: list[Phase]) -> dict:
    """The long-prompt phases together: gaps pooled, rates and TTFT averaged."""
    gaps = [g for p in phases for g in p.gaps_ms()]
    summaries = [p.summary() for p in phases]
    return {"itl_p50_ms": r3(percentile(gaps, 50)), "itl_p99_ms": r3(percentile(gaps, 99)),
            "itl_max_ms": r3(max(gaps)), "gaps": len(gaps), "runs": len(phases),
            **{key: r3(np.mean([s[key] for s in summaries]))
               for key in ("window_s", "stream_tokens_per_s", "tokens_per_s", "long_ttft_s")}}


def engine_config(flags: list[str], model_dir: str, emulate: str | None, seed: int):
    """The engine configuration a worker started with `flags` runs (parsed by the worker's own
    command line), in virtual timing."""
    from dataclasses import replace

    from mindmotor.cli import build_parser
    from mindmotor.worker.cli import config_from_args

    engine = config_from_args(build_parser().parse_args(["worker", *flags])).engine
    return replace(engine, model=model_dir, emulate=emulate, timing="virtual", seed=seed)


def step_budget(config, num_streams: int, long_prompt: list[int], seed: int) -> dict:
    """A configuration in-process: the long prompt beside `num_streams` decoding sequences, every
    step timed (host, and emulated); the longest while the long prompt prefills is one step's budget."""
    from mindmotor import SamplingParams
    from mindmotor.engine.llm_engine import LLMEngine

    engine = LLMEngine(config)
    rng = np.random.default_rng(seed + 1)
    vocab = engine.model.config.vocab_size
    for i in range(num_streams):
        engine.add_request(f"s{i}", rng.integers(1, vocab, SHORT_PROMPT_TOKENS).tolist(),
                           SamplingParams(max_tokens=CONTEXT // 2, ignore_eos=True, temperature=0))
    for _ in range(3):
        engine.step()
    engine.add_request("long", long_prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    host, emulated = [], []
    while "long" in engine.requests:
        before = engine.device.pacer.emulated_time_s
        started = time.perf_counter()
        engine.step()
        host.append((time.perf_counter() - started) * 1e3)
        emulated.append((engine.device.pacer.emulated_time_s - before) * 1e3)
    steps = [max(h, e) for h, e in zip(host, emulated)]
    return {"max_num_batched_attention": engine.scheduler.config.max_num_batched_attention,
            "long_prefill_token_threshold": engine.scheduler.config.long_prefill_token_threshold,
            "steps": len(steps), "step_p50_ms": r3(percentile(steps, 50)), "step_p99_ms": r3(percentile(steps, 99)),
            "step_max_ms": r3(max(steps)),
            "host_step_max_ms": r3(max(host)), "emulated_step_max_ms": r3(max(emulated)),
            "host_total_s": r3(sum(host) / 1e3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one long prompt, 3-second windows (~1-2 minutes)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None,
                        help="checkpoint directory (default: the bundled model's shape, random weights, 16k context)")
    parser.add_argument("--emulate", default=None, metavar="PROFILE",
                        help="emulated profile of the workers, e.g. qwen2-7b (default: the served model's shape)")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--long-tokens", type=int, default=8192)
    parser.add_argument("--after-args", default="", metavar="FLAGS",
                        help="more `mindmotor worker` flags for the after configuration, e.g. "
                             "\"--max-num-batched-attention 65536\" (default: none, the worker's defaults)")
    parser.add_argument("--save-json", default=None, metavar="PATH")
    args = parser.parse_args()
    window_s, repeats = (3.0, 1) if args.quick else (10.0, 3)
    configs = {"before": BEFORE_FLAGS, "after": shlex.split(args.after_args)}

    model_dir = args.model or long_context_checkpoint(args.seed)
    rng = np.random.default_rng(args.seed)
    vocab = LlamaConfig.from_dir(model_dir).vocab_size
    prompts = [rng.integers(1, vocab, SHORT_PROMPT_TOKENS).tolist() for _ in range(args.streams)]
    long_prompts = [rng.integers(1, vocab, args.long_tokens).tolist() for _ in range(repeats)]
    log_dir = Path(tempfile.mkdtemp(prefix="mindmotor-fair-prefill-logs-"))
    log(f"fair prefill: {args.streams} streams of {SHORT_PROMPT_TOKENS}-token prompts, a {args.long_tokens}-token "
        f"prompt, realtime workers over gRPC, emulated {args.emulate or 'served-model shape'}; logs in {log_dir}")

    started, load_start = time.perf_counter(), os.getloadavg()[0]
    runs = {name: run_config(name, flags, model_dir, args.emulate, prompts, long_prompts, window_s, log_dir)
            for name, flags in configs.items()}
    log("  one step's budget, in process ...")
    budget = step_budget(engine_config(configs["after"], model_dir, args.emulate, args.seed), args.streams,
                         long_prompts[0], args.seed)
    log(f"  {budget}")

    before, after = runs["before"], runs["after"]
    log("")
    log(f"{'ITL of the short streams (ms)':34s} {'p50':>8s} {'p99':>9s} {'max':>9s}   long TTFT   tokens/s")
    for name in configs:
        for case in ("alone", "with_long"):
            s = runs[name][case]
            ttft = f"{s['long_ttft_s']:8.2f} s" if "long_ttft_s" in s else " " * 10
            log(f"  {name:7s} {case:25s} {s['itl_p50_ms']:8.1f} {s['itl_p99_ms']:9.1f} {s['itl_max_ms']:9.1f}   "
                f"{ttft}  {s['tokens_per_s']:8.0f}")
    ratio_after = after["with_long"]["itl_p99_ms"] / after["alone"]["itl_p99_ms"]
    ratio_before = before["with_long"]["itl_p99_ms"] / before["alone"]["itl_p99_ms"]
    log(f"  p99 with / alone: before {ratio_before:.1f}x, after {ratio_after:.1f}x; one step's budget: p99 "
        f"{budget['step_p99_ms']:.1f} ms (p50 {budget['step_p50_ms']:.1f}, max {budget['step_max_ms']:.1f}, "
        f"emulated max {budget['emulated_step_max_ms']:.1f}; {budget['steps']} steps); load {load_start:.1f} -> "
        f"{os.getloadavg()[0]:.1f}")

    finish({"benchmark": "fair_prefill", "path": "worker process over gRPC, realtime timing",
            "emulated_profile": args.emulate or "served model shape", "streams": args.streams,
            "short_prompt_tokens": SHORT_PROMPT_TOKENS, "long_prompt_tokens": args.long_tokens,
            "long_prompts": repeats, "after_args": configs["after"],
            "model": args.model or "random weights, bundled-model shape, 16k context",
            "itl_p50_alone_ms": after["alone"]["itl_p50_ms"], "itl_p99_alone_ms": after["alone"]["itl_p99_ms"],
            "itl_p50_with_long_ms": after["with_long"]["itl_p50_ms"],
            "itl_p99_with_long_ms": after["with_long"]["itl_p99_ms"],
            "itl_p99_ratio": r3(ratio_after),
            "itl_p99_alone_before_ms": before["alone"]["itl_p99_ms"],
            "itl_p50_with_long_before_ms": before["with_long"]["itl_p50_ms"],
            "itl_p99_with_long_before_ms": before["with_long"]["itl_p99_ms"],
            "itl_p99_ratio_before": r3(ratio_before),
            "stall_bound_ms": budget["step_p99_ms"], "step_p50_ms": budget["step_p50_ms"],
            "step_max_ms": budget["step_max_ms"], "emulated_step_max_ms": budget["emulated_step_max_ms"],
            "long_ttft_s": after["with_long"]["long_ttft_s"], "long_ttft_before_s": before["with_long"]["long_ttft_s"],
            "tokens_per_s_with_long": after["with_long"]["tokens_per_s"],
            "tokens_per_s_with_long_before": before["with_long"]["tokens_per_s"],
            "budget": budget, "runs": runs, "load_avg_1m": [r3(load_start), r3(os.getloadavg()[0])],
            "wall_s": r3(time.perf_counter() - started)}, args.save_json)


if __name__ == "__main__":
    main()
