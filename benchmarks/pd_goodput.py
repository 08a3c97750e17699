"""P/D goodput on the Azure trace: the highest request rate each 4-card cluster serves within SLO.

Goodput as DistServe defines it (Zhong et al., "DistServe: Disaggregating Prefill and Decoding for
Goodput-optimized Large Language Model Serving", OSDI 2024): the highest request rate at which the
serving system meets its latency SLOs. Here "meets" is **p90 TTFT ≤ TTFT SLO and p99 TPOT ≤ TPOT
SLO** (TPOT per request: (last token − first token) / (tokens − 1)); the curves plot the other usual
figure, the fraction of requests meeting both targets, against the rate.

Clusters (4 emulated 910B3 cards, `qwen2-7b` profile, tp 1; `mindmotor.simulator`: a real
LLMEngine per card with the cost-only runner on a virtual clock, the coordinator's routing policies,
P/D handoffs through the engines' pins and KV loads, priced by the cost model):

  mixed          4 mixed instances, chunked prefill off (a whole prompt joins the decode batch)
  mixed_chunked  4 mixed instances, chunked prefill on, 2,048-token step budget
  1P:3D, 2P:2D, 3P:1D   P/D splits (KV over HCCS)
  dynamic        starts as 2P:2D; the controller's ratio policy (`controller/pd_ratio.decide`, its
                 default hysteresis, sustain and dwell, in emulated time) switches roles with a
                 drain (`simulator/dynamic_roles.py`), given the SLO pair as its targets

Requests: the first `--requests` of the Azure LLM conversation trace (prompt and output lengths as
recorded), Poisson arrivals at each rate (one seeded draw of unit-mean gaps, scaled by 1/rate, so
every rate and cluster sees the same requests in the same order). Search: a grid of rates, then
`--bisect` bisection steps between the highest rate that passes (with every lower grid rate) and
the next grid rate; the goodput is the highest rate that passed (resolution: grid step / 2^bisect).

Two windows, both reported: **steady state** (the headline: goodput is a rate a cluster *sustains*,
so the statistics skip the requests arriving in the first `--warmup` seconds — the same requests for
every cluster; this is where the dynamic cluster's start from 2P:2D and its controller's reaction
time — a 30 s sustain after the evidence, then a drain — are left out) and the **whole run** (every
request, start-up included).

Also reported, from the same run (`pd_split.ttft_bound`): the most any cluster could cut the mixed
cluster's p90 TTFT at its own goodput rate — a request's TTFT is at least its prompt's prefill alone
on an idle card.

    python benchmarks/pd_goodput.py [--quick] [--requests N] [--rates 2,4,8] [--bisect 3] [--warmup 120]

Progress and the table on stderr; the last stdout line is one JSON object; the goodput-vs-rate
curves go to `benchmarks/results/pd_goodput.png` (`--plot PATH`, `--no-plot`).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from mindmotor.controller import pd_ratio
from mindmotor.simulator import ClusterSpec, TraceRequest, load_trace, simulate
from mindmotor.simulator.dynamic_roles import DynamicRoles, DynamicRolesConfig
from mindmotor.simulator.report import SLO, summarize

from benchmarks.common import TRACE_CITATION, finish, log, r3, r4
from benchmarks.pd_split import ttft_bound, ttft_floor_p90

DEVICE, PROFILE = "910B3", "qwen2-7b"
BASE = ClusterSpec(mixed=0, prefill=2, decode=2, device=DEVICE, model=PROFILE, max_model_len=16384)
FIXED = {
    "mixed": replace(BASE, mixed=4, prefill=0, decode=0, enable_chunked_prefill=False,
                     max_num_batched_tokens=BASE.max_model_len),
    "mixed_chunked": replace(BASE, mixed=4, prefill=0, decode=0, max_num_batched_tokens=2048),
    "1P:3D": replace(BASE, prefill=1, decode=3),
    "2P:2D": BASE,
    "3P:1D": replace(BASE, prefill=3, decode=1),
}
SPLITS = ("1P:3D", "2P:2D", "3P:1D")
DYNAMIC_START = "2P:2D"
# (p90 TTFT, p99 TPOT) targets. On a 910B3, qwen2-7b: the trace's median prompt (~1,000 tokens)
# prefills in ~85 ms alone, its p90 prompt (~2,700) in ~0.23 s; a decode step of 64 sequences takes
# ~24 ms, of 128 ~32 ms.
SLOS = {
    "balanced": SLO(ttft_s=0.4, tpot_s=0.05),      # ~5x the median prefill; ~2x a loaded decode step
    "ttft_tight": SLO(ttft_s=0.25, tpot_s=0.1),    # just above the p90 prompt's prefill alone
    "tpot_tight": SLO(ttft_s=1.0, tpot_s=0.03),    # ~1.25x a 64-sequence decode step
}
FULL = dict(requests=6000, rates=(2, 4, 8, 12, 16, 20, 24, 28), bisect=3, warmup=120.0)
QUICK = dict(requests=300, rates=(4, 12, 20), bisect=1, warmup=10.0)


@dataclass
class Point:
    """One cluster at one rate, judged against one SLO pair over one window of requests."""
    rate: float
    ttft_p90_s: float
    tpot_p99_s: float
    attainment: float                  # fraction of requests meeting both targets
    passed: bool
    extra: dict


def requests_at(lengths: list[TraceRequest], gaps: np.ndarray, rate: float) -> list[TraceRequest]:
    arrivals = np.cumsum(gaps) / rate
    return [TraceRequest(float(a), t.prompt_tokens, t.output_tokens) for a, t in zip(arrivals, lengths)]


class Runner:
    """Simulates (cluster, rate) once — per SLO pair for `dynamic`, whose policy uses the targets —
    and judges the run against each SLO pair over both windows: `steady` (requests arriving after
    the warm-up) and `whole` (every request)."""

    def __init__(self, lengths: list[TraceRequest], seed: int, warmup_s: float,
                 policy: pd_ratio.RatioPolicyConfig = pd_ratio.RatioPolicyConfig()):
        self.lengths = lengths
        self.policy = policy
        self.gaps = np.random.default_rng(seed).exponential(1.0, len(lengths))
        self.warmup_s = warmup_s
        self.cache: dict[tuple, dict[tuple[str, str], Point]] = {}
        self.sims = 0
        self.sim_wall_s = 0.0

    def point(self, config: str, rate: float, slo_name: str, window: str = "steady") -> Point:
        key = (config, rate, slo_name if config == "dynamic" else None)
        if key not in self.cache:
            self.cache[key] = self._run(config, rate, slo_name)
        return self.cache[key][(slo_name, window)]

    def _run(self, config: str, rate: float, slo_name: str) -> dict[tuple[str, str], Point]:
        trace = requests_at(self.lengths, self.gaps, rate)
        if config == "dynamic":
            slo = SLOS[slo_name]
            roles = DynamicRoles(DynamicRolesConfig(pd_ratio.SLO(slo.ttft_s, slo.tpot_s), self.policy))
            result = simulate(FIXED[DYNAMIC_START], trace, roles=roles)
            judged = {slo_name: slo}
        else:
            result = simulate(FIXED[config], trace)
            judged = SLOS
        self.sims += 1
        self.sim_wall_s += result.wall_s
        windows = {"whole": result, "steady": self.after_warmup(result)}
        out = {}
        for (name, slo), (window, run) in itertools.product(judged.items(), windows.items()):
            s = summarize(run, slo)
            ttft, tpot = s["ttft_s"]["p90"], s["tpot_s"]["p99"] or 0.0
            extra = {"ttft_p50_s": r4(s["ttft_s"]["p50"]), "itl_p99_s": r4(s["itl_s"]["p99"] or 0.0),
                     "emulated_s": r3(result.makespan_s),
                     "cost_model": result.instances[0].cost_model, **result.extra}
            out[(name, window)] = Point(rate, ttft, tpot, s["goodput_fraction"],
                                        ttft <= slo.ttft_s and tpot <= slo.tpot_s, extra)
        some = out[(next(iter(judged)), "steady")]
        log(f"  {config:13s} {rate:7.3f}/s  " + "  ".join(
            f"{n}: {'ok ' if out[(n, 'steady')].passed else 'MISS'} {out[(n, 'steady')].attainment:5.1%}"
            f" (whole run {'ok' if out[(n, 'whole')].passed else 'MISS'})" for n in judged)
            + f"  [steady TTFT p90 {some.ttft_p90_s:.3f} s, TPOT p99 {some.tpot_p99_s * 1e3:.1f} ms; "
              f"{result.wall_s:.1f} s wall]")
        return out

    def after_warmup(self, result):
        kept = [r for r in result.requests if r.arrival_s >= self.warmup_s]
        if len(kept) < len(result.requests) / 10:
            raise ValueError(f"a warm-up of {self.warmup_s} s leaves {len(kept)} of {len(result.requests)} "
                             "requests; use more requests or a shorter --warmup")
        return replace(result, requests=kept)


def goodput(runner: Runner, config: str, slo_name: str, window: str, rates: tuple, steps: int
            ) -> tuple[float, bool]:
    """(the highest rate that passed, whether the grid's top rate passed — a lower bound then).
    Every grid rate is run (the curves need them); the search starts below the first miss."""
    passed = [runner.point(config, rate, slo_name, window).passed for rate in rates]
    first_miss = passed.index(False) if False in passed else len(rates)
    lo = rates[first_miss - 1] if first_miss else 0.0
    hi = rates[first_miss] if first_miss < len(rates) else None
    if hi is None:
        return lo, True
    for _ in range(steps):
        mid = (lo + hi) / 2
        if runner.point(config, mid, slo_name, window).passed:
            lo = mid
        else:
            hi = mid
    return lo, False


def curves(runner: Runner, config: str, slo_name: str, window: str = "steady") -> list[Point]:
    points = [p[(slo_name, window)] for (c, _, s), p in runner.cache.items()
              if c == config and (slo_name, window) in p and (s is None or s == slo_name)]
    return sorted(points, key=lambda p: p.rate)


def measure(runner: Runner, rates: tuple, steps: int) -> dict:
    """Per SLO pair: every cluster's goodput (steady state, and over the whole run), the curves,
    and the two ratios the issue asks for."""
    configs = [*FIXED, "dynamic"]
    out = {}
    for slo_name, slo in SLOS.items():
        log(f"SLO {slo_name}: p90 TTFT <= {slo.ttft_s} s, p99 TPOT <= {slo.tpot_s * 1e3:.0f} ms")
        found = {c: goodput(runner, c, slo_name, "steady", rates, steps) for c in configs}
        whole_found = {c: goodput(runner, c, slo_name, "whole", rates, steps) for c in configs}
        whole = {c: g for c, (g, _) in whole_found.items()}
        best_split = max(SPLITS, key=lambda c: found[c][0])
        best_whole = max(SPLITS, key=lambda c: whole[c])
        out[slo_name] = {
            "ttft_p90_slo_s": slo.ttft_s, "tpot_p99_slo_s": slo.tpot_s,
            "goodput_req_s": {c: r3(g) for c, (g, _) in found.items()},
            "at_least": [c for c, (_, top) in found.items() if top],
            "best_split": best_split,
            "best_split_over_mixed_chunked": ratio(found[best_split][0], found["mixed_chunked"][0]),
            "best_split_over_mixed": ratio(found[best_split][0], found["mixed"][0]),
            "dynamic_over_best_fixed_split": ratio(found["dynamic"][0], found[best_split][0]),
            "goodput_whole_run_req_s": {c: r3(g) for c, g in whole.items()},
            "at_least_whole_run": [c for c, (_, top) in whole_found.items() if top],
            "best_split_whole_run": best_whole,
            "best_split_over_mixed_chunked_whole_run": ratio(whole[best_whole], whole["mixed_chunked"]),
            "dynamic_over_best_fixed_split_whole_run": ratio(whole["dynamic"], whole[best_whole]),
            "dynamic_roles_at_goodput": dynamic_story(runner, slo_name, found["dynamic"][0]),
            "curves": {c: [(r3(p.rate), r3(p.attainment), p.passed) for p in curves(runner, c, slo_name)]
                       for c in configs},
        }
    return out


def ratio(a: float, b: float) -> float | None:
    return r3(a / b) if b > 0 else None


def dynamic_story(runner: Runner, slo_name: str, rate: float) -> dict | None:
    """The role switches of the dynamic cluster's run at its goodput rate."""
    if rate <= 0:
        return None
    roles = runner.point("dynamic", rate, slo_name).extra["dynamic_roles"]
    return {"final_roles": roles["final_roles"],
            "switches": [{"at_s": r3(s["decided_s"]), "done_s": r3(s["done_s"]) if s["done_s"] else None,
                          "to": s["new_role"], "reason": s["reason"]} for s in roles["switches"]]}


def bound(runner: Runner, slo_name: str, rate: float) -> dict:
    """pd_split's TTFT bound for the mixed cluster at `rate` (an evaluated one), every request."""
    mixed = runner.point("mixed", rate, slo_name, "whole")
    floor = ttft_floor_p90(mixed.extra["cost_model"], [t.prompt_tokens for t in runner.lengths])
    split = min((runner.point(c, rate, slo_name, "whole").ttft_p90_s, c) for c in SPLITS)
    return {"rate_req_s": r3(rate), **ttft_bound(floor, mixed.ttft_p90_s),
            "mixed_ttft_p90_s": r4(mixed.ttft_p90_s), "lowest_ttft_split": split[1],
            "split_ttft_p90_reduction_vs_mixed": r3(1 - split[0] / mixed.ttft_p90_s)}


def table(results: dict) -> str:
    configs = [*FIXED, "dynamic"]
    lines = [f"{'SLO (p90 TTFT / p99 TPOT)':40s} " + " ".join(f"{c:>13s}" for c in configs)
             + f" {'split/chunked':>13s} {'dyn/split':>9s}"]
    for name, r in results.items():
        for window, suffix in (("steady", ""), ("whole run", "_whole_run")):
            label = f"{name} ({r['ttft_p90_slo_s']} s / {r['tpot_p99_slo_s'] * 1e3:.0f} ms) {window}"
            goodputs = r[f"goodput{suffix}_req_s"]
            cells = [f"{goodputs[c]:>12.2f}{'+' if c in r['at_least' + suffix] else ' '}" for c in configs]
            lines.append(f"{label:40s} " + " ".join(cells)
                         + f" {_fmt(r['best_split_over_mixed_chunked' + suffix]):>13s}"
                         + f" {_fmt(r['dynamic_over_best_fixed_split' + suffix]):>9s}")
    return "\n".join(lines) + "\n(goodput in requests/s; + : the top grid rate passed, a lower bound)"


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def plot(results: dict, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 4.2), sharey=True)
    for ax, (name, r) in zip(np.atleast_1d(axes), results.items()):
        for config, points in r["curves"].items():
            rates, attained = [p[0] for p in points], [p[1] for p in points]
            ax.plot(rates, attained, marker=".", label=f"{config} ({r['goodput_req_s'][config]:.1f}/s)",
                    linestyle="--" if config == "dynamic" else "-")
        ax.axhline(0.9, color="grey", linewidth=0.6, linestyle=":")
        ax.set_title(f"{name}: p90 TTFT ≤ {r['ttft_p90_slo_s']} s, p99 TPOT ≤ {r['tpot_p99_slo_s'] * 1e3:.0f} ms",
                     fontsize=9)
        ax.set_xlabel("request rate (req/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left", title="cluster (goodput)", title_fontsize=7)
    np.atleast_1d(axes)[0].set_ylabel("fraction of requests within both SLOs")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="300 requests, 3 rates, 1 bisection step, 10 s warm-up (seconds)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--requests", type=int, default=None, help="trace requests per run (default 6000)")
    parser.add_argument("--rates", default=None, help="comma-separated grid, req/s (default 2,4,8,...,28)")
    parser.add_argument("--bisect", type=int, default=None, help="bisection steps after the grid (default 3)")
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds of arrivals the steady-state figures skip (default 120, --quick 10)")
    parser.add_argument("--sustain", type=float, default=None,
                        help="the dynamic cluster's policy sustain time, s (default: the controller's, 30)")
    parser.add_argument("--trace", default=None, help="trace CSV (default: the Azure conversation trace)")
    parser.add_argument("--plot", default=None, metavar="PATH",
                        help="default: benchmarks/results/pd_goodput[_quick].png")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--save-json", default=None, metavar="PATH")
    args = parser.parse_args(argv)
    mode = QUICK if args.quick else FULL
    n = args.requests or mode["requests"]
    rates = tuple(float(x) for x in args.rates.split(",")) if args.rates else mode["rates"]
    steps = mode["bisect"] if args.bisect is None else args.bisect
    warmup = mode["warmup"] if args.warmup is None else args.warmup
    lengths = (load_trace(args.trace, limit=n) if args.trace else load_trace(limit=n))
    log(f"pd_goodput: {len(lengths)} trace requests, rates {rates} + {steps} bisection steps, warm-up {warmup} s, "
        f"4x {DEVICE} emulating {PROFILE}")
    started = time.perf_counter()
    policy = pd_ratio.RatioPolicyConfig(**({} if args.sustain is None else {"sustain_s": args.sustain}))
    runner = Runner(lengths, args.seed, warmup, policy)
    results = measure(runner, rates, steps)
    log(table(results))
    balanced = results["balanced"]
    reference = max(balanced["goodput_req_s"]["mixed"], rates[0])
    ttft = bound(runner, "balanced", reference)
    if not args.no_plot:
        path = Path(args.plot) if args.plot else Path(__file__).resolve().parent / "results" / \
            f"pd_goodput{'_quick' if args.quick else ''}.png"
        plot(results, path, f"pd_goodput: {len(lengths)} Azure-trace requests, Poisson arrivals, "
                            f"4x {DEVICE} emulating {PROFILE}")
        log(f"  plot: {path}")
    result = {
        "benchmark": "pd_goodput",
        "goodput_req_s": balanced["goodput_req_s"],
        "best_split": balanced["best_split"],
        "best_split_over_mixed_chunked": balanced["best_split_over_mixed_chunked"],
        "dynamic_over_best_fixed_split": balanced["dynamic_over_best_fixed_split"],
        "goodput_whole_run_req_s": balanced["goodput_whole_run_req_s"],
        "best_split_over_mixed_chunked_whole_run": balanced["best_split_over_mixed_chunked_whole_run"],
        "dynamic_over_best_fixed_split_whole_run": balanced["dynamic_over_best_fixed_split_whole_run"],
        **{k: v for k, v in ttft.items() if k in ("ttft_p90_reduction_bound_vs_mixed", "ttft_p90_floor_s")},
        "ttft_bound": ttft,
        "slos": results,
        "requests": len(lengths), "rates": list(rates), "bisection_steps": steps, "warmup_s": warmup,
        "resolution_req_s": r3(min(np.diff((0.0, *rates))) / 2 ** steps),
        "arrivals": f"Poisson, seed {args.seed}", "trace": TRACE_CITATION, "device": DEVICE, "profile": PROFILE,
        "cards": 4, "dynamic_start": DYNAMIC_START, "dynamic_policy": vars(policy),
        "simulations": runner.sims,
        "sim_wall_s": r3(runner.sim_wall_s), "wall_s": r3(time.perf_counter() - started), "quick": args.quick,
    }
    finish(result, args.save_json)


if __name__ == "__main__":
    main()
