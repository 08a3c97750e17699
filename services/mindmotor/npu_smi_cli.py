"""`mindmotor npu-smi`: print emulated NPUs like `npu-smi info`.

Sources of device status (one per invocation):
  --status-json FILE|-   telemetry snapshots as JSON: a list, {"devices": [...]}, or one dict
  --metrics-url URL      a worker's Prometheus side port (repeatable)
  --worker HOST:PORT     a worker's gRPC Status call

Nothing heavy is imported at module import time; the handlers import what they need.
"""

from __future__ import annotations

import argparse
import sys

# Prometheus metric name -> snapshot key; every sample is labelled `device`.
METRIC_KEYS = {
    "mindmotor_npu_utilization_percent": "utilization",
    "mindmotor_npu_hbm_used_bytes": "hbm_used_bytes",
    "mindmotor_npu_hbm_total_bytes": "hbm_total_bytes",
    "mindmotor_npu_power_watts": "power_w",
    "mindmotor_npu_temperature_celsius": "temperature_c",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("npu-smi", help="show emulated NPUs like `npu-smi info`")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--status-json", metavar="FILE_OR_-",
                        help="read telemetry snapshots from a JSON file ('-' for stdin)")
    source.add_argument("--metrics-url", metavar="URL", action="append",
                        help="scrape a worker's Prometheus /metrics (repeatable)")
    source.add_argument("--worker", metavar="HOST:PORT", action="append",
                        help="ask a worker's gRPC Status (repeatable)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per HTTP request")
    from mindmotor.common.rpc_args import add_arguments as add_rpc_arguments

    add_rpc_arguments(parser)           # for --worker
    parser.set_defaults(func=run_npu_smi)


def run_npu_smi(args: argparse.Namespace) -> int:
    from mindmotor.device.npu_smi import format_npu_smi

    try:
        if args.status_json:
            snapshots = load_status_json(args.status_json)
        elif args.metrics_url:
            snapshots = []
            for url in args.metrics_url:
                snapshots += snapshots_from_metrics(fetch_text(url, args.timeout))
        elif args.worker:
            from mindmotor.common.rpc import configure_from_args
            from mindmotor.worker.client import fetch_status

            configure_from_args(args)

            snapshots = [dict(fetch_status(address, args.timeout), npu_id=i)
                         for i, address in enumerate(args.worker)]
        else:
            print("npu-smi: give --status-json, --metrics-url or --worker", file=sys.stderr)
            return 2
    except (OSError, ValueError) as exc:
        print(f"npu-smi: {exc}", file=sys.stderr)
        return 1
    print(format_npu_smi(snapshots))
    return 0


def load_status_json(path: str) -> list[dict]:
    import json

    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    data = json.loads(text)
    if isinstance(data, dict):
        data = data.get("devices", [data])
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise ValueError(f"{path}: expected a list of device snapshots")
    return data


def fetch_text(url: str, timeout: float) -> str:
    """GET `url` with httpx (urllib when httpx is not installed); OSError on failure."""
    try:
        import httpx
    except ModuleNotFoundError:
        import urllib.request

        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read().decode("utf-8")
    try:
        response = httpx.get(url, timeout=timeout)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise OSError(f"cannot read {url}: {exc}") from exc
    return response.text


def snapshots_from_metrics(text: str) -> list[dict]:
    """One snapshot per `device` label value, in order of first appearance."""
    from prometheus_client.parser import text_string_to_metric_families

    by_device: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = METRIC_KEYS.get(sample.name)
            device = sample.labels.get("device")
            if key is None or device is None:
                continue
            snap = by_device.setdefault(device, {"device": device, "health": "OK"})
            snap[key] = sample.value
    return [dict(snap, npu_id=i) for i, snap in enumerate(by_device.values())]
