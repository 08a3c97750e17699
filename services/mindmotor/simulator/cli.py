"""`mindmotor simulate`: replay a trace against a cluster description in emulated time.

    mindmotor simulate --instances 8 --device 910B3 --model qwen2-7b --duration 3600
    mindmotor simulate --prefill 2 --decode 6 --routing least_load --slo-ttft 2 --slo-tpot 0.05 --json
    mindmotor simulate --prefill 2 --decode 2 --rate 16 --duration 900 --slo-ttft 0.4 --slo-tpot 0.05 --dynamic-roles
    mindmotor simulate --search --rate 8 --duration 300 --slo-ttft 2 --slo-tpot 0.05 --pd

Nothing heavy is imported until the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    from mindmotor.simulator.cluster import ROUTING_POLICIES

    p = subparsers.add_parser("simulate", help="replay a trace on an emulated cluster (no model runs)")
    p.add_argument("--trace", default=None, help="CSV (Azure trace columns or arrival_s,prompt_tokens,"
                   "output_tokens); default the Azure LLM conversation trace 2023 shipped in the package")
    p.add_argument("--duration", type=float, default=None, help="seconds of the trace to replay")
    p.add_argument("--start", type=float, default=0.0, help="trace second to start at")
    p.add_argument("--rate", type=float, default=None, help="rescale arrivals to this mean req/s")
    p.add_argument("--limit", type=int, default=None, help="at most this many requests")
    p.add_argument("--cluster", default=None, help="a JSON cluster description (ClusterSpec fields)")
    p.add_argument("--instances", type=int, default=None, help="mixed instances (default 1)")
    p.add_argument("--prefill", type=int, default=None, help="prefill instances (P/D split)")
    p.add_argument("--decode", type=int, default=None, help="decode instances (P/D split)")
    p.add_argument("--device", default=None, help="emulated device (default 910B3)")
    p.add_argument("--model", default=None, help="profile name or config.json (default qwen2-7b)")
    p.add_argument("--tp", type=int, default=None, help="cards per instance")
    p.add_argument("--routing", choices=ROUTING_POLICIES, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    overhead = p.add_mutually_exclusive_group()
    overhead.add_argument("--frontend-overhead-ms", type=float, default=None, metavar="MS",
                          help="milliseconds of serving path (HTTP, coordinator, gRPC) per request; "
                               "benchmarks/sim_vs_realtime.py measures it (default: the last measurement, "
                               f"{_default_overhead_ms()} ms; 0: the engines alone)")
    overhead.add_argument("--frontend-overhead", type=float, default=None, metavar="S",
                          help="the same in seconds")
    p.add_argument("--slo-ttft", type=float, default=None, help="TTFT SLO, seconds")
    p.add_argument("--slo-tpot", type=float, default=None, help="TPOT SLO, seconds per token")
    p.add_argument("--dynamic-roles", action="store_true",
                   help="P/D split: switch roles at run time with the controller's ratio policy "
                        "(its default hysteresis; --slo-ttft/--slo-tpot are its targets)")
    p.add_argument("--search", action="store_true", help="find the fewest cards meeting the SLO")
    p.add_argument("--target", type=float, default=0.9, help="--search: share of requests within SLO")
    p.add_argument("--pd", action="store_true", help="--search: also try P:D splits")
    p.add_argument("--max-instances", type=int, default=32, help="--search: give up above this")
    p.add_argument("--prefix-caching", action="store_true", default=None,
                   help="prefix caching on (a trace with a session column has reuse to find)")
    p.add_argument("--kv-host-bytes", type=_size, default=None, metavar="SIZE",
                   help="per instance: the KV host tier's host memory, e.g. 64GiB (default 0: none; "
                        "needs --prefix-caching)")
    p.add_argument("--cache-chunk-size", type=_size, default=None, metavar="SIZE",
                   help="the host tier's chunk (default 256MiB)")
    p.add_argument("--prefetch-depth", type=int, default=None, help="host-tier chunk copies in flight (default 2)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_simulate)


FLAG_FIELDS = {"instances": "mixed", "prefill": "prefill", "decode": "decode", "device": "device",
               "model": "model", "tp": "tp", "routing": "routing", "max_num_seqs": "max_num_seqs",
               "max_num_batched_tokens": "max_num_batched_tokens", "max_model_len": "max_model_len",
               "frontend_overhead": "frontend_overhead_s", "prefix_caching": "enable_prefix_caching",
               "kv_host_bytes": "kv_host_bytes", "cache_chunk_size": "cache_chunk_size",
               "prefetch_depth": "prefetch_depth"}


def _size(text: str) -> int:
    from mindmotor.engine.host_memory import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _default_overhead_ms() -> str:
    from mindmotor.simulator.cluster import FRONTEND_OVERHEAD_S

    return f"{FRONTEND_OVERHEAD_S * 1e3:g}"


def build_spec(args: argparse.Namespace):
    from mindmotor.simulator.cluster import ClusterSpec

    overrides = {f: getattr(args, a) for a, f in FLAG_FIELDS.items() if getattr(args, a) is not None}
    if getattr(args, "frontend_overhead_ms", None) is not None:
        overrides["frontend_overhead_s"] = args.frontend_overhead_ms / 1e3
    if (args.prefill or args.decode) and args.instances is None:
        overrides.setdefault("mixed", 0)
    if args.cluster:
        return ClusterSpec.from_file(args.cluster, **overrides)
    return ClusterSpec(**overrides)


def dynamic_roles(args: argparse.Namespace, spec):
    """`--dynamic-roles`: the controller's P/D ratio policy with the SLO as its targets, or None."""
    if not args.dynamic_roles:
        return None
    if args.search or not spec.prefill or args.slo_ttft is None or args.slo_tpot is None:
        raise ValueError("--dynamic-roles needs a P/D split (--prefill, --decode) and --slo-ttft and --slo-tpot, "
                         "without --search")
    from mindmotor.controller.pd_ratio import SLO as RatioSLO
    from mindmotor.simulator.dynamic_roles import DynamicRoles, DynamicRolesConfig

    return DynamicRoles(DynamicRolesConfig(RatioSLO(args.slo_ttft, args.slo_tpot)))


def run_simulate(args: argparse.Namespace) -> int:
    from mindmotor.simulator.report import SLO, summarize
    from mindmotor.simulator.search import search
    from mindmotor.simulator.simulator import simulate
    from mindmotor.simulator.trace import DEFAULT_TRACE, load_trace

    try:
        spec = build_spec(args)
        trace = load_trace(args.trace or DEFAULT_TRACE, duration_s=args.duration, start_s=args.start,
                           rate=args.rate, limit=args.limit)
        slo = SLO(args.slo_ttft, args.slo_tpot)
        if args.search:
            if slo.ttft_s is None and slo.tpot_s is None:
                raise ValueError("--search needs --slo-ttft and/or --slo-tpot")
            result = search(spec, trace, slo, args.target, args.max_instances, args.pd)
        else:
            sim = simulate(spec, trace, roles=dynamic_roles(args, spec))
            result = summarize(sim, slo) | sim.extra
    except ValueError as exc:
        print(f"simulate: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    elif args.search:
        print(format_search(result, args))
    else:
        print(format_summary(result))
    return 0 if not args.search or result["found"] else 1


def _ms(d: dict) -> str:
    return "  ".join(f"{k} {v * 1e3:8.1f}" if v is not None else f"{k} -" for k, v in d.items())


def format_summary(s: dict) -> str:
    c = s["cluster"]
    lines = [
        f"{c['instances']} instances ({c['roles']['mixed']} mixed, {c['roles']['prefill']} prefill, "
        f"{c['roles']['decode']} decode) of {c['model']} tp{c['tp']} on {c['device']}, {c['routing']}",
        f"{s['requests']} requests ({s['clipped_requests']} clipped), {s['output_tokens']} output tokens, "
        f"{s['emulated_makespan_s']:.1f} s emulated in {s['wall_s']:.1f} s wall",
        f"throughput {s['throughput_tokens_per_s']:.1f} tok/s, utilization {s['utilization_mean']:.1%}, "
        f"KV usage mean {s['kv_usage_mean']:.1%} peak {s['kv_usage_peak']:.1%}, preemptions {s['preemptions']}",
        f"TTFT ms  {_ms(s['ttft_s'])}", f"TPOT ms  {_ms(s['tpot_s'])}",
        f"ITL ms   {_ms(s['itl_s'])}", f"E2E ms   {_ms(s['e2e_s'])}",
    ]
    if s["slo"]["ttft_s"] is not None or s["slo"]["tpot_s"] is not None:
        lines.append(f"goodput {s['goodput_fraction']:.1%} of requests ({s['goodput_req_per_s']:.2f} req/s) "
                     f"within TTFT <= {s['slo']['ttft_s']} s, TPOT <= {s['slo']['tpot_s']} s")
    if s["handoffs"]:
        lines.append(f"P/D handoffs {s['handoffs']}, "
                     f"KV transfer {s['kv_transfer_s_total']:.2f} s in total")
    if "dynamic_roles" in s:
        d = s["dynamic_roles"]
        lines.append(f"dynamic roles: {len(d['switches'])} switch(es), ending at P:D "
                     f"{d['final_roles']['prefill']}:{d['final_roles']['decode']}" + "".join(
                         f"; {w['decided_s']:.0f} s instance {w['instance']} {w['old_role']} -> {w['new_role']} "
                         f"({w['reason']})" for w in d["switches"]))
    return "\n".join(lines)


def format_search(r: dict, args: argparse.Namespace) -> str:
    lines = [f"{'mixed':>5} {'P':>3} {'D':>3} {'cards':>5} {'goodput':>8} {'TTFT p90 ms':>12} {'TPOT p90 ms':>12}"]
    for t in r["tried"]:
        lines.append(f"{t['mixed']:>5} {t['prefill']:>3} {t['decode']:>3} {t['cards']:>5} "
                     f"{t['goodput_fraction']:>8.1%} {t['ttft_p90_s'] * 1e3:>12.1f} "
                     f"{(t['tpot_p90_s'] or 0) * 1e3:>12.1f}")
    if r["found"]:
        b = r["best"]
        layout = f"{b['mixed']} mixed" if b["mixed"] else f"P:D {b['prefill']}:{b['decode']}"
        lines.append(f"fewest cards: {b['cards']} ({layout}), {b['goodput_fraction']:.1%} within SLO")
    else:
        lines.append(f"no cluster up to {args.max_instances} instances meets the SLO for {args.target:.0%}")
    return "\n".join(lines)
