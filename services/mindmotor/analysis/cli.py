"""`mindmotor analyze latency`: where a running platform's request time goes (analysis/latency.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("analyze", help="analyses of a running platform (latency)")
    commands = parser.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)
    latency = commands.add_parser(
        "latency", help="per model and class, where request time goes (coordinator, worker queue, prefill, decode, "
                        "network) and the top phases, from the coordinator's /metrics")
    latency.add_argument("--url", default="http://127.0.0.1:8000",
                         help="the coordinator (its /metrics is read); default %(default)s (`mindmotor up`'s)")
    latency.add_argument("--window", type=float, default=0.0, metavar="SECONDS",
                         help="break down only the requests that finish within SECONDS from now (two scrapes); "
                              "0 (default): every request since the coordinator started")
    latency.add_argument("--top", type=int, default=3, help="phases named as the top causes (default %(default)s)")
    latency.add_argument("--json", action="store_true", help="print JSON instead of a table")
    latency.add_argument("--plot", metavar="FILE.png", help="also draw a stacked bar per model and class "
                                                            "(needs matplotlib: the bench extra)")
    latency.add_argument("--cacert", help="CA bundle for an HTTPS coordinator")
    latency.add_argument("--timeout", type=float, default=10.0, help="seconds per scrape (default %(default)s)")
    latency.set_defaults(func=run_latency)


def _scrape(args) -> str:
    import httpx

    url = args.url.rstrip("/") + "/metrics"
    try:
        response = httpx.get(url, timeout=args.timeout, verify=args.cacert or True)
    except httpx.HTTPError as exc:
        raise SystemExit(f"mindmotor analyze latency: cannot read {url}: {exc}") from None
    if response.status_code != 200:
        raise SystemExit(f"mindmotor analyze latency: {url} answered {response.status_code}")
    return response.text


def run_latency(args) -> int:
    from .latency import MetricsError, breakdown, parse, plot, render

    if args.window < 0 or args.top < 1:
        print("mindmotor analyze latency: --window must be >= 0 and --top >= 1", file=sys.stderr)
        return 2
    try:
        snap = parse(_scrape(args))
        if args.window > 0:
            time.sleep(args.window)
            snap = parse(_scrape(args)).minus(snap)
    except MetricsError as exc:
        print(f"mindmotor analyze latency: {args.url}: {exc}", file=sys.stderr)
        return 1
    rows = breakdown(snap)
    if args.json:
        print(json.dumps([b.as_dict() for b in rows], indent=2))
    else:
        print(render(rows, args.top))
    if args.plot:
        if not rows:
            print("mindmotor analyze latency: nothing to plot", file=sys.stderr)
            return 1
        try:
            plot(rows, args.plot)
        except ImportError:
            print("mindmotor analyze latency: --plot needs matplotlib (pip install 'mindmotor[bench]')",
                  file=sys.stderr)
            return 1
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0
