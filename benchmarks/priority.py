"""Priority scheduling with SLO classes: does an interactive stream keep its TTFT under a batch flood?

One engine (cost-only runner: no forward pass; the emulated 910B3's cost model prices every step,
virtual timing) serves, for `--duration` emulated seconds, an interactive Poisson stream
(256-token prompts, 64-token outputs) and a batch flood (1,024-token prompts, 256-token outputs)
whose sum is `--load` (1.5) times the engine's capacity — measured first: the same mix all at once,
requests / makespan. The same arrivals run three times:

  isolated   the interactive stream alone
  fcfs       both, one priority (first come, first served)
  priority   both, at the coordinator's default class priorities (slo_classes.py: interactive
             -10, batch 10); the engine orders its queue and picks preemption victims by them

Every request runs to its end (the flood is drained after the arrivals stop). Goodput: output
tokens of requests that met their class's targets (interactive: TTFT and TPOT of the default
classes; batch has none, so every batch token counts) per emulated second of the run.
`batch_wait_bound_s` is the bound on a batch request's wait that aging would guarantee: the engine
has no aging (engine/scheduler.py orders by (priority, arrival) only), so there is none (null), and
`batch_max_wait_s` (arrival to its first step) is what the flood's drain took.

    .venv/bin/python benchmarks/priority.py --quick     # ~1 minute
    .venv/bin/python benchmarks/priority.py             # 120 emulated seconds of arrivals

Progress on stderr; ONE JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from benchmarks.common import finish, log, percentile, r3  # noqa: E402
from mindmotor.coordinator.slo_classes import DEFAULT_CLASSES  # noqa: E402
from mindmotor.engine.config import EngineConfig  # noqa: E402
from mindmotor.engine.llm_engine import LLMEngine  # noqa: E402
from mindmotor.rules.sampling_params import SamplingParams  # noqa: E402

DEVICE, PROFILE, BLOCK = "910B3", "llama2-7b", 16
SHAPES = {"interactive": (256, 64), "batch": (1024, 256)}       # (prompt, output) tokens
INTERACTIVE_SHARE = 0.2                                         # of the requests


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def config(args) -> EngineConfig:
    return EngineConfig(device=DEVICE, emulate=PROFILE, runner="cost_only", timing="virtual", block_size=BLOCK,
                        num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs, enable_prefix_caching=False,
                        seed=args.seed)


def run(cfg: EngineConfig, arrivals: list[tuple[float, str]], priorities: dict[str, int]) -> dict:
    """Drive the engine on the emulated clock; per-request records and its preemptions."""
    clock = Clock()
    engine = LLMEngine(cfg, clock=clock)
    vocab = engine.vocab_size
    pending = sorted(arrivals)
    records: dict[str, dict] = {}
    i = 0
    while i < len(pending) or engine.has_unfinished_requests():
        while i < len(pending) and pending[i][0] <= clock.now:
            t, cls = pending[i]
            prompt, output = SHAPES[cls]
            rid = f"{cls}-{i}"
            engine.add_request(rid, [2 + i % (vocab - 2)] * prompt, SamplingParams(max_tokens=output, ignore_eos=True),
                               priority=priorities[cls], arrival_time=t)
            records[rid] = dict(cls=cls, arrival=t, output=output, first=None, end=None, scheduled=None)
            i += 1
        if not engine.has_unfinished_requests():
            clock.now = pending[i][0]
            continue
        outputs = engine.step()
        clock.now += engine.last_step_s
        for out in outputs:
            rec = records[out.request_id]
            if rec["first"] is None and out.new_token_ids:
                rec["first"] = clock.now
            if out.finished:
                rec["end"], rec["scheduled"] = clock.now, out.first_scheduled_time
    return dict(records=records, makespan=clock.now, preemptions=engine.scheduler.num_preemptions)


def capacity(cfg: EngineConfig, n: int) -> float:
    """Requests per emulated second of the mix, all arriving at once."""
    mix = [(0.0, "interactive" if k % round(1 / INTERACTIVE_SHARE) == 0 else "batch") for k in range(n)]
    result = run(cfg, mix, {"interactive": 0, "batch": 0})
    return n / result["makespan"]


def poisson(rng: np.random.Generator, rate: float, duration: float) -> list[float]:
    times, t = [], 0.0
    while True:
        t += rng.exponential(1 / rate)
        if t >= duration:
            return times
        times.append(t)


def summary(result: dict) -> dict:
    recs = result["records"].values()
    ttft = [r["first"] - r["arrival"] for r in recs if r["cls"] == "interactive"]
    targets = DEFAULT_CLASSES["interactive"]
    good = 0
    for r in recs:
        if r["cls"] == "interactive":
            tpot = (r["end"] - r["first"]) / max(1, r["output"] - 1)
            if r["first"] - r["arrival"] > targets.ttft_s or tpot > targets.tpot_s:
                continue
        good += r["output"]
    waits = [r["scheduled"] - r["arrival"] for r in recs if r["cls"] == "batch" and r["scheduled"] is not None]
    return dict(ttft_p99=percentile(ttft, 99) if ttft else float("nan"), goodput=good / result["makespan"],
                batch_max_wait=max(waits) if waits else 0.0, preemptions=result["preemptions"],
                makespan=result["makespan"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 emulated seconds of arrivals (about a minute)")
    parser.add_argument("--duration", type=float, default=None, help="emulated seconds of arrivals (default 120)")
    parser.add_argument("--load", type=float, default=1.5, help="offered load over capacity (default 1.5)")
    parser.add_argument("--num-blocks", type=int, default=4096, help="KV blocks (of 16 tokens; default 4096)")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-json", default=None, metavar="PATH")
    args = parser.parse_args()
    duration = args.duration or (30.0 if args.quick else 120.0)
    started = time.perf_counter()
    cfg = config(args)
    cap = capacity(cfg, 60 if args.quick else 200)
    rng = np.random.default_rng(args.seed)
    live = poisson(rng, args.load * cap * INTERACTIVE_SHARE, duration)
    flood = poisson(rng, args.load * cap * (1 - INTERACTIVE_SHARE), duration)
    log(f"capacity {cap:.2f} req/s; {len(live)} interactive + {len(flood)} batch over {duration:g} s (load "
        f"{args.load}x)")
    mixed = [(t, "interactive") for t in live] + [(t, "batch") for t in flood]
    classes = {name: c.priority for name, c in DEFAULT_CLASSES.items()}
    isolated = summary(run(cfg, [(t, "interactive") for t in live], classes))
    log(f"isolated: {isolated}")
    fcfs = summary(run(cfg, mixed, {"interactive": 0, "batch": 0}))
    log(f"fcfs: {fcfs}")
    prio = summary(run(cfg, mixed, classes))
    log(f"priority: {prio}")
    finish({
        "interactive_ttft_p99_vs_isolated": r3(prio["ttft_p99"] / isolated["ttft_p99"]),
        "fcfs_over_priority_interactive_ttft_p99": r3(fcfs["ttft_p99"] / prio["ttft_p99"]),
        "goodput_vs_fcfs": r3(prio["goodput"] / fcfs["goodput"]),
        "batch_max_wait_s": r3(prio["batch_max_wait"]),
        "batch_wait_bound_s": None,                       # no aging in the engine: no bound
        "preemptions": prio["preemptions"],
        "fcfs_preemptions": fcfs["preemptions"],
        "interactive_ttft_p99_s": {"isolated": r3(isolated["ttft_p99"]), "fcfs": r3(fcfs["ttft_p99"]),
                                   "priority": r3(prio["ttft_p99"])},
        "fcfs_batch_max_wait_s": r3(fcfs["batch_max_wait"]),
        "capacity_req_per_s": r3(cap), "load": args.load, "duration_s": duration,
        "requests": {"interactive": len(live), "batch": len(flood)},
        "makespan_s": {"fcfs": r3(fcfs["makespan"]), "priority": r3(prio["makespan"])},
        "wall_s": r3(time.perf_counter() - started),
    }, args.save_json)


if __name__ == "__main__":
    main()
