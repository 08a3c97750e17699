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

The priority run's engine has `priority_aging_s` (`--priority-aging-s`, 2 s) and
`lower_class_prefill_tokens` (`--lower-class-prefill-tokens`, 192; engine/scheduler.py,
"Classes"); the FCFS baseline is vLLM's fcfs (neither). `batch_max_wait_s` is the longest the
batch class waited for one of its requests to start while it had requests waiting (the wait
priority imposes; the scheduler's `class_wait_max`) and `batch_wait_bound_s` the bound aging
guarantees on it: `priority_aging_s` + the run's longest step (null if an aged request missed
the step after — `aging.misses`). Under the flood's own overload a batch request also queues
behind earlier batch requests, as in FCFS: `batch_max_queue_s` (arrival to its first step),
which no class order can bound. `interactive_ttft_floor_p99_s`: the least TTFT a scheduler that
cuts no step short could give the priority run's interactive requests — the rest of the step
under way at arrival, then the prompt's prefill in a step of its own — over the isolated p99
(`interactive_ttft_floor_p99_vs_isolated`): where that exceeds 1.5 so must
`interactive_ttft_p99_vs_isolated`, and only shorter batch steps (fewer batch decodes at once:
their KV reads) could lower it.

    .venv/bin/python benchmarks/priority.py --quick     # 30 emulated seconds of arrivals (~10-30 s)
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
AGING_S = 2.0                   # the priority run's priority_aging_s
LOWER_CLASS_TOKENS = 192        # ... and lower_class_prefill_tokens


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def config(args, classes: bool = True) -> EngineConfig:
    """The engine of every run; `classes` False: the FCFS baseline's (vLLM's fcfs: no aging, no
    lower-class cap — which would not apply to one priority anyway)."""
    return EngineConfig(device=DEVICE, emulate=PROFILE, runner="cost_only", timing="virtual", block_size=BLOCK,
                        num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs, enable_prefix_caching=False,
                        seed=args.seed, priority_aging_s=args.priority_aging_s if classes else 0.0,
                        lower_class_prefill_tokens=args.lower_class_prefill_tokens if classes else 0)


def prefill_alone_s(cfg: EngineConfig) -> float:
    """An interactive prompt's prefill in a step of its own (the least a first token can take)."""
    clock = Clock()
    engine = LLMEngine(cfg, clock=clock)
    prompt, _ = SHAPES["interactive"]
    engine.add_request("alone", [2] * prompt, SamplingParams(max_tokens=1, ignore_eos=True), arrival_time=0.0)
    engine.step()
    return engine.last_step_s


def run(cfg: EngineConfig, arrivals: list[tuple[float, str]], priorities: dict[str, int]) -> dict:
    """Drive the engine on the emulated clock; per-request records and its preemptions."""
    clock = Clock()
    engine = LLMEngine(cfg, clock=clock)
    vocab = engine.vocab_size
    pending = sorted(arrivals)
    records: dict[str, dict] = {}
    i = 0
    longest_step = 0.0
    while i < len(pending) or engine.has_unfinished_requests():
        while i < len(pending) and pending[i][0] <= clock.now:
            t, cls = pending[i]
            prompt, output = SHAPES[cls]
            rid = f"{cls}-{i}"
            engine.add_request(rid, [2 + i % (vocab - 2)] * prompt, SamplingParams(max_tokens=output, ignore_eos=True),
                               priority=priorities[cls], arrival_time=t)
            # `seen`: the end of the step under way when it arrived (no step is cut short for it)
            records[rid] = dict(cls=cls, arrival=t, output=output, first=None, end=None, scheduled=None,
                                seen=clock.now)
            i += 1
        if not engine.has_unfinished_requests():
            clock.now = pending[i][0]
            continue
        outputs = engine.step()
        clock.now += engine.last_step_s
        longest_step = max(longest_step, engine.last_step_s)
        for out in outputs:
            rec = records[out.request_id]
            if rec["first"] is None and out.new_token_ids:
                rec["first"] = clock.now
            if out.finished:
                rec["end"], rec["scheduled"] = clock.now, out.first_scheduled_time
    sched = engine.scheduler
    return dict(records=records, makespan=clock.now, preemptions=sched.num_preemptions,
                class_preemptions=sched.num_class_preemptions, aged=sched.num_aged, aging_misses=sched.aging_misses,
                longest_step=longest_step, wait_bound=sched.wait_bound_s(longest_step),
                class_wait=dict(sched.class_wait_max))


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


def summary(result: dict, prefill_alone: float = 0.0) -> dict:
    recs = result["records"].values()
    ttft = [r["first"] - r["arrival"] for r in recs if r["cls"] == "interactive"]
    # the TTFT no step-at-a-time scheduler beats: the rest of the step under way, then its prefill alone
    floor = [r["seen"] - r["arrival"] + prefill_alone for r in recs if r["cls"] == "interactive"]
    targets = DEFAULT_CLASSES["interactive"]
    good = 0
    for r in recs:
        if r["cls"] == "interactive":
            tpot = (r["end"] - r["first"]) / max(1, r["output"] - 1)
            if r["first"] - r["arrival"] > targets.ttft_s or tpot > targets.tpot_s:
                continue
        good += r["output"]
    queued = [r["scheduled"] - r["arrival"] for r in recs if r["cls"] == "batch" and r["scheduled"] is not None]
    return dict(ttft_p99=percentile(ttft, 99) if ttft else float("nan"), goodput=good / result["makespan"],
                batch_max_queue=max(queued) if queued else 0.0, preemptions=result["preemptions"],
                batch_max_wait=result["class_wait"].get(DEFAULT_CLASSES["batch"].priority),
                class_preemptions=result["class_preemptions"], aged=result["aged"],
                aging_misses=result["aging_misses"], longest_step=result["longest_step"],
                wait_bound=result["wait_bound"], makespan=result["makespan"],
                ttft_floor_p99=percentile(floor, 99) if floor else float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 emulated seconds of arrivals (about a minute)")
    parser.add_argument("--duration", type=float, default=None, help="emulated seconds of arrivals (default 120)")
    parser.add_argument("--load", type=float, default=1.5, help="offered load over capacity (default 1.5)")
    parser.add_argument("--num-blocks", type=int, default=4096, help="KV blocks (of 16 tokens; default 4096)")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--priority-aging-s", type=float, default=AGING_S,
                        help=f"the engine's priority_aging_s (default {AGING_S:g}; 0: no aging, no bound)")
    parser.add_argument("--lower-class-prefill-tokens", type=int, default=LOWER_CLASS_TOKENS,
                        help=f"the engine's lower_class_prefill_tokens (default {LOWER_CLASS_TOKENS}; 0: off)")
    parser.add_argument("--save-json", default=None, metavar="PATH")
    args = parser.parse_args()
    duration = args.duration or (30.0 if args.quick else 120.0)
    started = time.perf_counter()
    cfg, fcfs_cfg = config(args), config(args, classes=False)
    cap = capacity(fcfs_cfg, 60 if args.quick else 200)
    alone = prefill_alone_s(cfg)
    rng = np.random.default_rng(args.seed)
    live = poisson(rng, args.load * cap * INTERACTIVE_SHARE, duration)
    flood = poisson(rng, args.load * cap * (1 - INTERACTIVE_SHARE), duration)
    log(f"capacity {cap:.2f} req/s; {len(live)} interactive + {len(flood)} batch over {duration:g} s (load "
        f"{args.load}x)")
    mixed = [(t, "interactive") for t in live] + [(t, "batch") for t in flood]
    classes = {name: c.priority for name, c in DEFAULT_CLASSES.items()}
    isolated = summary(run(cfg, [(t, "interactive") for t in live], classes), alone)
    log(f"isolated: {isolated}")
    fcfs = summary(run(fcfs_cfg, mixed, {"interactive": 0, "batch": 0}), alone)
    log(f"fcfs: {fcfs}")
    prio = summary(run(cfg, mixed, classes), alone)
    log(f"priority: {prio}")
    finish({
        "interactive_ttft_p99_vs_isolated": r3(prio["ttft_p99"] / isolated["ttft_p99"]),
        "fcfs_over_priority_interactive_ttft_p99": r3(fcfs["ttft_p99"] / prio["ttft_p99"]),
        "goodput_vs_fcfs": r3(prio["goodput"] / fcfs["goodput"]),
        "batch_max_wait_s": r3(prio["batch_max_wait"] or 0.0),
        "batch_wait_bound_s": r3(prio["wait_bound"]) if prio["wait_bound"] is not None else None,
        "preemptions": prio["preemptions"],
        "class_preemptions": prio["class_preemptions"],
        "fcfs_preemptions": fcfs["preemptions"],
        "interactive_ttft_floor_p99_vs_isolated": r3(prio["ttft_floor_p99"] / isolated["ttft_p99"]),
        "interactive_ttft_floor_p99_s": r3(prio["ttft_floor_p99"]), "prefill_alone_s": r3(alone),
        "aging": {"priority_aging_s": args.priority_aging_s, "aged": prio["aged"], "misses": prio["aging_misses"],
                  "longest_step_s": r3(prio["longest_step"])},
        "lower_class_prefill_tokens": args.lower_class_prefill_tokens,
        "interactive_ttft_p99_s": {"isolated": r3(isolated["ttft_p99"]), "fcfs": r3(fcfs["ttft_p99"]),
                                   "priority": r3(prio["ttft_p99"])},
        "batch_max_queue_s": {"fcfs": r3(fcfs["batch_max_queue"]), "priority": r3(prio["batch_max_queue"])},
        "capacity_req_per_s": r3(cap), "load": args.load, "duration_s": duration,
        "requests": {"interactive": len(live), "batch": len(flood)},
        "makespan_s": {"fcfs": r3(fcfs["makespan"]), "priority": r3(prio["makespan"])},
        "wall_s": r3(time.perf_counter() - started),
    }, args.save_json)


if __name__ == "__main__":
    main()
