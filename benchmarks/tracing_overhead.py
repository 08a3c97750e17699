"""What tracing costs: the request rate of a coordinator + worker pair exporting every request's
spans (100 % sampling: a span per choice and per worker call at the coordinator; the call at the
worker, with its queue, prefill and decode as attributes and events) over OTLP/HTTP, against an
identical pair with tracing off.

Both pairs run at once (a `--timing virtual` worker with a tiny random-weight model, so its time is
host time; the coordinator as `mindmotor coordinator`), and are driven at once: per round, two
closed-loop clients in this process (C keep-alive connections each, `max_tokens` 4,
non-streaming), one per pair, for the same seconds. The pairs are CPU-bound, so they share the
host's cores and whatever else runs on them takes its CPU from both alike: the traced pair's rate,
relative to the other's in the same round, is what its extra CPU per request costs. (Driving
them one after the other, the rate swung 0.3-1.9x between adjacent windows on this shared host.)
`throughput_ratio` = median over `--rounds` rounds of (rate with tracing / rate without); goal
≥ 0.90. `rps_tracing_on` / `rps_tracing_off`: the medians of the rates, for scale. The OTLP
receiver (tests/support/otlp_receiver.py) is an HTTP server in this process that decodes every
export (it shares the clients' CPU). The pairs' CPU per request (coordinator + worker, from
/proc) is reported too: `cpu_throughput_ratio` = CPU per request without / with tracing.
`spans_received` checks the traced pair really exported (3 spans per request, warmups included;
`measured_requests_traced` counts only the measured ones).

    .venv/bin/python benchmarks/tracing_overhead.py --quick      # 6 rounds of 2 s, about 40 s
    .venv/bin/python benchmarks/tracing_overhead.py              # 12 rounds of 3 s, about 1 min

Progress on stderr; ONE JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))    # the OTLP receiver the tests use

from benchmarks.coordinator_overhead import (Server, closed_loop, completion_body, coordinator_args,  # noqa: E402
                                             tiny_model)
from otlp_receiver import OtlpReceiver  # noqa: E402


def log(msg: str) -> None:
    print(f"[tracing_overhead] {msg}", file=sys.stderr, flush=True)


def start_pair(model_dir: str, name: str, log_dir: Path, endpoint: str | None) -> list[Server]:
    tracing = ["--otlp-traces-endpoint", endpoint] if endpoint else []
    worker = Server("worker", ["worker", "--model", model_dir, "--host", "127.0.0.1", "--port", "0",
                               "--metrics-port", "0", "--timing", "virtual", *tracing],
                    "MINDMOTOR_WORKER_READY", log_dir / f"worker-{name}.log")
    worker.wait_ready()
    coordinator = Server("coordinator", ["coordinator", *coordinator_args(worker.port, Path(model_dir).name, model_dir),
                                         *tracing],
                         "MINDMOTOR_COORDINATOR_READY", log_dir / f"coordinator-{name}.log")
    coordinator.wait_ready()
    return [worker, coordinator]


def run(args) -> dict:
    receiver = OtlpReceiver(keep=False)
    rounds = args.rounds or (6 if args.quick else 12)
    duration, warmup = (2.0, 0.5) if args.quick else (3.0, 0.5)
    with tempfile.TemporaryDirectory(prefix="tracing-overhead-") as tmp:
        tmp_path = Path(tmp)
        model_dir = tiny_model(tmp_path / "model")
        body = completion_body(Path(model_dir).name, 4)
        pairs = {}
        try:
            pairs["off"] = start_pair(model_dir, "off", tmp_path, None)
            pairs["on"] = start_pair(model_dir, "on", tmp_path, receiver.url)
            rates: dict[str, list[float]] = {"off": [], "on": []}
            cpu_ms: dict[str, list[float]] = {"off": [], "on": []}     # the pair's CPU per request
            requests_on = 0
            names = ("off", "on")

            async def both(order: tuple[str, str]) -> dict[str, dict]:
                # the two pairs at once: whatever else the host runs takes its CPU from both alike
                # (which client connects and sends first alternates between rounds)
                results = await asyncio.gather(*(closed_loop(pairs[n][1].port, "/v1/completions", body,
                                                             args.concurrency, duration, warmup) for n in order))
                return dict(zip(order, results))

            for i in range(rounds):
                cpu_before = {n: sum(s.cpu_s() for s in pairs[n]) for n in names}
                by_name = asyncio.run(both(names if i % 2 == 0 else names[::-1]))
                results = [by_name[n] for n in names]
                for name, result in zip(names, results):
                    cpu = sum(s.cpu_s() for s in pairs[name]) - cpu_before[name]
                    rates[name].append(result["rps"])
                    # the warmup ran at about the measured rate: its requests are in the CPU too
                    cpu_ms[name].append(1000 * cpu / max(1.0, result["rps"] * (duration + warmup)))
                    if name == "on":
                        requests_on += result["requests"]
                log(f"round {i}: off {results[0]['rps']:.1f} req/s, on {results[1]['rps']:.1f} req/s "
                    f"(ratio {results[1]['rps'] / max(results[0]['rps'], 1e-9):.3f}); p99 off "
                    f"{results[0]['p99_ms']:.0f} ms, on {results[1]['p99_ms']:.0f} ms; errors "
                    f"{results[0]['errors'] or ''}{results[1]['errors'] or ''}")
            time.sleep(1.0)                     # the last batches (exported every 5 s at most; shutdown flushes)
        finally:
            for servers in pairs.values():
                for s in reversed(servers):            # SIGTERM: the traced ones flush their last spans
                    s.stop()
        receiver.close()
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    paired = [a / b for a, b in zip(rates["on"], rates["off"]) if b > 0]
    cpu_off, cpu_on = statistics.median(cpu_ms["off"]), statistics.median(cpu_ms["on"])
    return {"throughput_ratio": round(statistics.median(paired), 3), "rps_tracing_off": round(off, 1), "rps_tracing_on": round(on, 1),
            "cpu_ms_per_request_off": round(cpu_off, 2), "cpu_ms_per_request_on": round(cpu_on, 2),
            "cpu_throughput_ratio": round(cpu_off / cpu_on, 3), "loadavg_at_end": list(os.getloadavg()),
            "rounds": rounds, "concurrency": args.concurrency, "spans_received": receiver.count,
            "measured_requests_traced": requests_on,     # (warmup requests are traced too, not counted)
            "rates": {k: [round(x, 1) for x in v] for k, v in rates.items()},
            "ratio_per_round": [round(x, 3) for x in paired]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    print(json.dumps(run(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
