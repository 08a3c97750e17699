"""Prefill/decode split vs mixed instances at the same offered load: p90 TTFT and p90 TPOT.

Four emulated 910B3 instances serving the `qwen2-7b` profile; prompts ~2,000 tokens (uniform
1,800–2,200), outputs ~200 (uniform 180–220, EOS ignored); random token ids; Poisson arrivals at
`--rate` requests/s. Three clusters get the same requests at the same times:

  mixed          4 mixed instances, chunked prefill off (whole prompts join the decode batch)
  mixed_chunked  4 mixed instances, chunked prefill on (token budget `--chunk-tokens` per step)
  split          2 prefill + 2 decode instances; the KV moves over HCCS, priced by the cost model

`--mode emulated` (default): in-process, on one emulated clock (benchmarks/pd_cluster.py): every
engine steps on its own card's clock, events and steps in global time order; figures are emulated
time (host speed does not enter). TTFT = first token − arrival (for the split: the first token on
the prefill instance); TPOT = (last token − first token) / (tokens − 1) per request.

`--mode realtime`: real worker processes with `--timing realtime` behind a real coordinator, an
HTTP streaming client, the host's lag reported per worker (benchmarks/pd_realtime.py).

    python benchmarks/pd_split.py [--mode emulated|realtime] [--quick] [--rate R] [--requests N]

Progress on stderr; the last stdout line is one JSON object; CDF plots of TTFT and TPOT go to
`benchmarks/results/pd_split_<mode>.png` (`--plot PATH`, `--no-plot`).
"""

from __future__ import annotations

import os

if __name__ == "__main__":
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

from benchmarks.bounds import prefill_ttft_floor
from benchmarks.common import (BenchRequest, _progress_bar, add_common_args, benchmark_checkpoint, finish, log,
                               percentile, poisson_arrivals, r3, r4, random_tokens)
from benchmarks.pd_cluster import ClusterSim, Instance
from benchmarks.pd_plots import plot_cdfs

PROFILE = "qwen2-7b"
DEVICE = "910B3"
NUM_INSTANCES = 4


def make_requests(n: int, vocab_size: int, seed: int, rate: float, prompt=(1800, 2200), output=(180, 220)
                  ) -> list[BenchRequest]:
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(rng, n, rate)
    return [BenchRequest(f"req-{i}", random_tokens(rng, vocab_size, int(rng.integers(prompt[0], prompt[1] + 1))),
                         int(rng.integers(output[0], output[1] + 1)), arrival_s=float(t))
            for i, t in enumerate(arrivals)]


def engine(model_dir: str, seed: int, chunked: bool, chunk_tokens: int) -> LLMEngine:
    return LLMEngine(EngineConfig(
        model=model_dir, device=DEVICE, emulate=PROFILE, timing="virtual", seed=seed,
        enable_chunked_prefill=chunked, max_num_batched_tokens=chunk_tokens if chunked else 8192))


def cluster(kind: str, model_dir: str, seed: int, chunk_tokens: int) -> list[Instance]:
    if kind == "split":
        roles = ["prefill"] * (NUM_INSTANCES // 2) + ["decode"] * (NUM_INSTANCES - NUM_INSTANCES // 2)
        return [Instance(f"{r}-{i}", r, engine(model_dir, seed, chunked=(r == "decode"), chunk_tokens=8192))
                for i, r in enumerate(roles)]
    chunked = kind == "mixed_chunked"
    return [Instance(f"mixed-{i}", "mixed", engine(model_dir, seed, chunked, chunk_tokens))
            for i in range(NUM_INSTANCES)]


def summarize(result, wall_s: float) -> dict:
    recs = result.records
    ttft = [r.first_token_s - r.arrival_s for r in recs]
    tpot = [(r.finished_s - r.first_token_s) / (r.num_output_tokens - 1) for r in recs if r.num_output_tokens > 1]
    out = {"ttft_p50_s": r4(percentile(ttft, 50)), "ttft_p90_s": r4(percentile(ttft, 90)),
           "ttft_p99_s": r4(percentile(ttft, 99)), "tpot_p50_s": r4(percentile(tpot, 50)),
           "tpot_p90_s": r4(percentile(tpot, 90)), "tpot_p99_s": r4(percentile(tpot, 99)),
           "throughput_tok_s": r3(sum(r.num_output_tokens for r in recs) / result.makespan_s),
           "completed": len(recs), "steps": result.steps, "wall_s": r3(wall_s),
           "ttft_s": [r4(x) for x in ttft], "tpot_s": [r4(x) for x in tpot]}
    if result.transfers_s:
        out["kv_transfer_mean_s"] = round(float(np.mean(result.transfers_s)), 6)
    return out


def run_emulated(args, model_dir: str, requests: list[BenchRequest]) -> dict:
    runs = {}
    for kind in ("mixed", "mixed_chunked", "split"):
        bar = _progress_bar(sum(r.output_len for r in requests), kind)
        started = time.perf_counter()
        sim = ClusterSim(cluster(kind, model_dir, args.seed, args.chunk_tokens), link=args.link, progress=bar)
        result = sim.run([BenchRequest(r.request_id, r.prompt_token_ids, r.output_len, r.arrival_s) for r in requests])
        if bar is not None:
            bar.close()
        runs[kind] = summarize(result, time.perf_counter() - started)
        log(f"  {kind:14s} {brief(runs[kind])}")
    return runs


def brief(run: dict) -> dict:
    return {k: v for k, v in run.items() if k not in ("ttft_s", "tpot_s", "workers")}


def ttft_floor_p90(cost_model, prompt_lens) -> float:
    """p90 over the requests of their prompt's prefill alone on an idle card: no p90 TTFT can be lower."""
    return percentile([prefill_ttft_floor(cost_model, n) for n in prompt_lens], 90)


def ttft_bound(ttft_floor_p90_s: float, mixed_ttft_p90_s: float) -> dict:
    """The most any cluster could reduce the mixed p90 TTFT measured in the same run."""
    return {"ttft_p90_reduction_bound_vs_mixed": r3(1 - ttft_floor_p90_s / mixed_ttft_p90_s),
            "ttft_p90_floor_s": r4(ttft_floor_p90_s)}


def comparison(runs: dict, ttft_floor_p90_s: float) -> dict:
    """The issue's keys, and the most the split could reduce the mixed p90 TTFT measured in this
    run: a request's TTFT is at least its prompt's prefill alone on an idle card."""
    mixed, chunked, split = runs["mixed"], runs["mixed_chunked"], runs["split"]
    return {"ttft_p90_reduction_vs_mixed": r3(1 - split["ttft_p90_s"] / mixed["ttft_p90_s"]),
            **ttft_bound(ttft_floor_p90_s, mixed["ttft_p90_s"]),
            "tpot_p90_ratio_vs_mixed": r3(split["tpot_p90_s"] / mixed["tpot_p90_s"]),
            "ttft_p90_reduction_vs_chunked": r3(1 - split["ttft_p90_s"] / chunked["ttft_p90_s"]),
            "tpot_p90_ratio_vs_chunked": r3(split["tpot_p90_s"] / chunked["tpot_p90_s"])}


def lag_figures(runs: dict) -> dict:
    """Host lag of the realtime runs: per cluster, and whether any of them was host-bound."""
    per = {kind: {"host_lag_s": run["host_lag_s"], "host_lag_share": run["host_lag_share"],
                  "host_bound": run["host_bound"], "client_loop_delay_max_s": run["client_loop_delay_max_s"]}
           for kind, run in runs.items()}
    return {"host_lag": per, "host_bound": any(p["host_bound"] for p in per.values())}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--mode", choices=("emulated", "realtime"), default="emulated",
                        help="emulated: in-process, one emulated clock; realtime: worker processes, a "
                             "coordinator and an HTTP client on this machine (default: %(default)s)")
    parser.add_argument("--rate", type=float, default=None, help="requests/s (default: 12; realtime --quick: 6)")
    parser.add_argument("--requests", type=int, default=None,
                        help="(default: 400, --quick 120; realtime: 240, --quick 60)")
    parser.add_argument("--chunk-tokens", type=int, default=2048,
                        help="token budget per step of the chunked-prefill baseline (default: %(default)s)")
    parser.add_argument("--link", choices=("intra_node", "inter_node"), default="intra_node")
    parser.add_argument("--plot", default=None, metavar="PATH",
                        help="CDF plot (default: benchmarks/results/pd_split_<mode>[_quick].png)")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    realtime = args.mode == "realtime"
    n = args.requests or {(False, False): 400, (False, True): 120, (True, False): 240, (True, True): 60}[
        (realtime, args.quick)]
    rate = args.rate or (6.0 if realtime and args.quick else 12.0)
    if realtime:
        from benchmarks import pd_realtime

        model_dir = args.model or pd_realtime.host_checkpoint(args.seed)
    else:
        model_dir = benchmark_checkpoint(args.model, args.seed)
    vocab = LLMEngine(EngineConfig(model=model_dir, num_blocks=16)).model.config.vocab_size
    requests = make_requests(n, vocab, args.seed, rate)
    log(f"pd_split: {n} requests at {rate}/s, {NUM_INSTANCES}x {DEVICE} emulating {PROFILE}, mode {args.mode}")

    if realtime:
        runs = pd_realtime.run(model_dir, requests, args.chunk_tokens, args.seed)
        mode = ("realtime: 4 worker processes (--timing realtime) + coordinator + HTTP streaming client on this "
                "host; client-side TTFT/TPOT")
    else:
        runs = run_emulated(args, model_dir, requests)
        mode = "in-process, virtual emulated clock (no host time in the figures)"
    if not args.no_plot:
        suffix = "_quick" if args.quick else ""
        path = plot_cdfs(runs, args.plot or Path(__file__).resolve().parent / "results" /
                         f"pd_split_{args.mode}{suffix}.png",
                         f"pd_split ({args.mode}): {n} requests at {rate}/s, 4x {DEVICE} emulating {PROFILE}")
        log(f"  plot: {path}")
    cost_model = engine(model_dir, args.seed, chunked=False, chunk_tokens=8192).device.cost_model
    floor_p90 = ttft_floor_p90(cost_model, [r.prompt_len for r in requests])
    result = {"benchmark": "pd_split", "mode": mode, **comparison(runs, floor_p90)}
    if realtime:
        result.update(lag_figures(runs))
    result.update({"rate_per_s": rate, "requests": n, "instances": NUM_INSTANCES, "split": "2P:2D", "device": DEVICE,
                   "profile": PROFILE, "chunk_tokens": args.chunk_tokens, "link": args.link, "quick": args.quick,
                   "runs": {kind: brief(run) for kind, run in runs.items()}})
    if realtime:
        for kind, run in runs.items():
            result["runs"][kind]["workers"] = run["workers"]
    finish(result, args.save_json)


if __name__ == "__main__":
    main()
