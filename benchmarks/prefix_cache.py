"""Prefix caching on shared-prefix traffic: mean TTFT with the cache on vs off.

Every request is a 1,024-token system prompt shared by all, plus a distinct user part (50–300
tokens, uniform) and an output of 32–128 tokens (uniform; EOS ignored); random token ids. Arrivals
are Poisson. The engine emulates `qwen2-7b` on a 910B3 in virtual timing, and the benchmark's
virtual-clock driver (benchmarks/common.py) hands each request to the engine when the emulated
clock reaches its arrival, so TTFT = (emulated clock at the end of the step that produced the first
token) - arrival, queueing included. Same requests, same arrival times, once with
`enable_prefix_caching=True` and once with False, in the same process.
"""

from __future__ import annotations

import os

if __name__ == "__main__":
    # Before numpy loads: single-threaded OpenBLAS unless the caller set it. On this shared 2-core
    # machine the default threaded BLAS makes small matmuls erratic (see docs/benchmarks.md).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from mindmotor.engine.config import EngineConfig
from mindmotor.engine.llm_engine import LLMEngine

from benchmarks.common import (BenchRequest, VirtualClockDriver, add_common_args,
                               benchmark_checkpoint, describe_model, finish, log, mean, percentile,
                               poisson_arrivals, r3, r4, random_tokens)

PROFILE = "qwen2-7b"
DEVICE = "910B3"


def make_requests(n: int, vocab_size: int, seed: int, rate: float, system_len: int = 1024,
                  user_len: tuple[int, int] = (50, 300), output_len: tuple[int, int] = (32, 128)
                  ) -> list[BenchRequest]:
    rng = np.random.default_rng(seed)
    system = random_tokens(rng, vocab_size, system_len)
    arrivals = poisson_arrivals(rng, n, rate)
    reqs = []
    for i, t in enumerate(arrivals):
        user = random_tokens(rng, vocab_size, int(rng.integers(user_len[0], user_len[1] + 1)))
        out = int(rng.integers(output_len[0], output_len[1] + 1))
        reqs.append(BenchRequest(f"req-{i}", system + user, out, arrival_s=float(t)))
    return reqs


def run_once(requests: list[BenchRequest], model_dir: str, seed: int, caching: bool,
             run_model: bool = True, progress: bool = True) -> dict:
    engine = LLMEngine(EngineConfig(model=model_dir, device=DEVICE, emulate=PROFILE, timing="virtual",
                                    enable_prefix_caching=caching, seed=seed))
    name = "on" if caching else "off"
    t = time.perf_counter()
    res = VirtualClockDriver(engine, requests, progress=progress, desc=f"caching {name}",
                             run_model=run_model).run()
    engine.check_invariants()
    ttft = [r.ttft_s for r in res.records]
    e2e = [r.finished_s - r.arrival_s for r in res.records]
    tpot = [(r.finished_s - r.first_token_s) / (r.num_output_tokens - 1)
            for r in res.records if r.num_output_tokens > 1]
    st = engine.stats()
    out = {
        "ttft_mean_s": r4(mean(ttft)), "ttft_p50_s": r4(percentile(ttft, 50)),
        "ttft_p90_s": r4(percentile(ttft, 90)), "ttft_p99_s": r4(percentile(ttft, 99)),
        "e2e_mean_s": r4(mean(e2e)), "tpot_mean_s": r4(mean(tpot)),
        "prefix_hit_rate": r4(st.prefix_hit_rate),
        "cached_prompt_tokens": sum(r.num_cached_tokens for r in res.records),
        "prompt_tokens_computed": st.prompt_tokens,
        "output_tokens": res.output_tokens,
        "emulated_busy_s": r4(res.emulated_busy_s),
        "emulated_makespan_s": r4(res.emulated_makespan_s),
        "device_busy_fraction": r3(res.emulated_busy_s / res.emulated_makespan_s),
        "throughput_tok_per_emulated_s": r3(res.output_tokens / res.emulated_makespan_s),
        "throughput_req_per_emulated_s": r3(len(res.records) / res.emulated_makespan_s),
        "steps": res.steps,
        "preemptions": st.num_preemptions,
        "wall_s": r3(res.wall_s),
    }
    log(f"[prefix_cache] caching {name}: mean TTFT {out['ttft_mean_s'] * 1e3:.1f} ms, p90 "
        f"{out['ttft_p90_s'] * 1e3:.1f} ms, hit rate {out['prefix_hit_rate']:.3f}, busy "
        f"{out['device_busy_fraction']:.2f}, wall {time.perf_counter() - t:.1f} s")
    return out, engine


def run(num_requests: int = 400, rate: float = 6.0, seed: int = 0, model: str | None = None,
        system_len: int = 1024, run_model: bool = True, progress: bool = True) -> dict:
    model_dir = benchmark_checkpoint(model, seed)
    probe = LLMEngine(EngineConfig(model=model_dir, device=DEVICE, emulate=PROFILE))
    requests = make_requests(num_requests, probe.model.config.vocab_size, seed, rate, system_len=system_len)
    log(f"[prefix_cache] {num_requests} requests, Poisson {rate}/s, system prompt {system_len} tokens "
        f"({PROFILE} on {DEVICE}, {'numpy model running' if run_model else 'no model forward'})")
    on, _ = run_once(requests, model_dir, seed, True, run_model, progress)
    off, _ = run_once(requests, model_dir, seed, False, run_model, progress)
    return {
        "benchmark": "prefix_cache",
        "num_requests": num_requests,
        "ttft_reduction": r4(1.0 - on["ttft_mean_s"] / off["ttft_mean_s"]),
        "target_ttft_reduction": 0.35,
        "ttft_mean_on_s": on["ttft_mean_s"], "ttft_mean_off_s": off["ttft_mean_s"],
        "ttft_p90_on_s": on["ttft_p90_s"], "ttft_p90_off_s": off["ttft_p90_s"],
        "prefix_hit_rate": on["prefix_hit_rate"],
        "throughput_on_tok_per_emulated_s": on["throughput_tok_per_emulated_s"],
        "throughput_off_tok_per_emulated_s": off["throughput_tok_per_emulated_s"],
        "caching_on": on, "caching_off": off,
        "workload": {"system_prompt_tokens": system_len, "user_tokens": [50, 300],
                     "output_tokens": [32, 128], "arrival": f"Poisson {rate}/s",
                     "arrival_rate_per_s": rate, "ran_model": run_model,
                     "prompt_tokens_total": sum(r.prompt_len for r in requests),
                     "output_tokens_total": sum(r.output_len for r in requests)},
        "setup": {**describe_model(probe, model),
                  "timing": "virtual (emulated 910B time from the roofline cost model)", "seed": seed},
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap)
    ap.add_argument("--num-requests", type=int, default=None, help="default 400 (80 with --quick)")
    ap.add_argument("--rate", type=float, default=6.0, help="Poisson arrivals per emulated second")
    ap.add_argument("--system-len", type=int, default=1024)
    ap.add_argument("--no-model", action="store_true",
                    help="step without the numpy forward (emulated figures only; much faster)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    n = args.num_requests or (80 if args.quick else 400)
    result = run(num_requests=n, rate=args.rate, seed=args.seed, model=args.model,
                 system_len=args.system_len, run_model=not args.no_model,
                 progress=not args.no_progress)
    result["quick"] = bool(args.quick)
    finish(result, args.save_json)
    return result


if __name__ == "__main__":
    main()
