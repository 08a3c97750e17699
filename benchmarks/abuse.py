"""The front door under attack (issue 19): the test corpus of specs and inputs that used to crash
or stall the coordinator, sent concurrently with steady bystander load against `mindmotor up`.

One `mindmotor up` on 127.0.0.1 (defaults: the bundled demo model, 2 workers on an emulated 910B3
in realtime, 2 coordinator replicas). For `--duration` seconds:

- B bystander clients send short greedy completions (`max_tokens` 16) one after the other through
  the openai SDK (its default retries on connection errors);
- A attacker threads cycle through the corpus, each request a new variant (so no verdict cache
  answers it): 3,000-rule chained Lark grammars (`guided_grammar`), grammars within the limits that
  overflow a helper's stack (`structured_outputs.grammar`), 2,500-deep `$ref` chains
  (`response_format`), 5,000 tools, tools whose forced schema nests 100 deep, ~70 KB GBNF grammars,
  1 MB prompts (completions and chat), a 100,000-deep JSON body.

Reported: every attack request's status (goal: each a 200 or a 4xx — no 5xx, no lost answer), the
services that died or were restarted during the run (goal: none — the pids of every `mindmotor`
service under `up` are the same at the end; helper processes are expected to die, and are
counted), the bystanders' success rate (goal ≥ 99 %) and latency p50/p99 (goal p99 ≤ 5 s), and
the coordinators' event-loop lag (p99 and the largest bucket reached).

    .venv/bin/python benchmarks/abuse.py --quick          # 20 s of attack, ~1.5 minutes in all
    .venv/bin/python benchmarks/abuse.py                  # 60 s

Progress on stderr; a table, then ONE JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import ssl
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))

from abuse_specs import chained_lark, large_gbnf, nested_schema, optional_chain, ref_chain, tools  # noqa: E402
from mindmotor.runtime.child_process import ChildProcess  # noqa: E402
from mindmotor.runtime.proc_tree import descendants  # noqa: E402

MODEL = "mindmotor-demo"
REQUEST_TIMEOUT_S = 60.0


def log(msg: str) -> None:
    print(f"[abuse] {msg}", file=sys.stderr, flush=True)


# ---- the corpus: (name, endpoint, body) for variant i ---------------------------------------------
def _chat(model: str, **fields) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **fields}


def _completion(model: str, **fields) -> dict:
    return {"model": model, "prompt": "def f(x):", "max_tokens": 8, **fields}


MEGABYTE_TEXT = "def f(x):\n    return x\n" * 40_000          # ~1 MB of JSON once escaped


def corpus(i: int, model: str = MODEL) -> list[tuple[str, str, str]]:
    """Every kind of attack once, as variant `i` (each spec differs from every other variant's)."""
    m = model
    items = [
        ("lark chain 3,000 rules", "completions", _completion(m, guided_grammar=chained_lark(3000 + i))),
        ("crashing grammar within limits", "completions",
         _completion(m, structured_outputs={"grammar": optional_chain(1990 - i % 50)})),
        ("$ref chain 2,500 deep", "chat/completions", _chat(m, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": ref_chain(2500 + i)}})),
        ("5,000 tools", "chat/completions", _chat(m, tools=tools(5000 + i))),
        ("forced tool nested 100 deep", "chat/completions",
         _chat(m, tools=tools(1, nested_schema(100 + i)), tool_choice="required")),
        ("GBNF ~70 KB", "completions", _completion(m, guided_grammar=large_gbnf(600 + i))),
        ("1 MB prompt", "completions", _completion(m, prompt=MEGABYTE_TEXT + str(i))),
        ("1 MB chat message", "chat/completions",
         _chat(m, messages=[{"role": "user", "content": MEGABYTE_TEXT + str(i)}])),
    ]
    out = [(name, endpoint, json.dumps(body)) for name, endpoint, body in items]
    out.append(("JSON body 100,000 deep", "completions",
                '{"model": "%s", "prompt": %s%s}' % (m, "[" * 100_000, "]" * 100_000)))
    return out


# ---- load --------------------------------------------------------------------------------------
class _Threads:
    """Threads running `self._run(i)` until `stop()`."""

    def __init__(self, url: str, count: int):
        self.url = url
        self.results: list = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(count)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(REQUEST_TIMEOUT_S + 5)


class Bystanders(_Threads):
    """Short greedy completions one after the other; results: (latency s, succeeded)."""

    def _run(self, index: int) -> None:
        import openai

        sdk = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S)
        for n in itertools.count():
            if self._stop.is_set():
                return
            started = time.monotonic()
            try:
                sdk.completions.create(model=MODEL, prompt=f"bystander {index} request {n}: def f(x):",
                                       max_tokens=16, temperature=0)
                ok = True
            except openai.OpenAIError:
                ok = False
            self.results.append((time.monotonic() - started, ok))


class Attackers(_Threads):
    """The corpus, each round a new variant; results: (kind, status or 0: no answer, seconds)."""

    def __init__(self, url: str, threads: int):
        super().__init__(url, threads)
        self._variant = itertools.count()
        self._lock = threading.Lock()

    def _run(self, index: int) -> None:
        with httpx.Client(timeout=REQUEST_TIMEOUT_S, headers={"content-type": "application/json"}) as http:
            while not self._stop.is_set():
                with self._lock:
                    i = next(self._variant)
                for name, endpoint, body in corpus(i):
                    if self._stop.is_set():
                        return
                    started = time.monotonic()
                    try:
                        status = http.post(f"{self.url}/v1/{endpoint}", content=body).status_code
                    except httpx.HTTPError:
                        status = 0
                    self.results.append((name, status, time.monotonic() - started))


# ---- the platform ------------------------------------------------------------------------------
def service_pids(up: ChildProcess) -> dict[int, str]:
    """pid → command line of every `mindmotor` service under up (helpers excluded)."""
    out = {}
    for pid in descendants(up.proc.pid):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if args[1:3] == ["-m", "mindmotor.cli"]:
            out[pid] = " ".join(args[3:5])
    return out


def metrics_text(up: ChildProcess) -> str:
    return httpx.get(f"{up.ready['url']}/metrics", timeout=10).text


def up_metric_total(up: ChildProcess, name: str) -> float:
    context = ssl.create_default_context(cafile=str(Path(up.ready["state_dir"]) / "pki" / "ca.pem"))
    text = httpx.get(f"https://127.0.0.1:{up.ready['metrics_port']}/metrics", verify=context, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def histogram(text: str, name: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of a histogram without labels."""
    out = []
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    return sorted(out)


def quantile_bound(buckets: list[tuple[float, float]], q: float) -> float:
    """The smallest bucket bound under which a fraction `q` of the samples fall."""
    total = buckets[-1][1] if buckets else 0.0
    for bound, count in buckets:
        if total and count >= q * total:
            return bound
    return 0.0


def counter_sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="mindmotor-abuse-"))
    config = {"port": 0, "state_dir": str(tmp / "state"), "log_dir": str(tmp / "logs"), "coordinators": args.coordinators,
              "models": [{"workers": args.workers, "timing": args.timing}]}
    (tmp / "up.yaml").write_text(yaml.safe_dump(config))
    up = ChildProcess("up", ["up", "--config", str(tmp / "up.yaml")], "MINDMOTOR_UP_READY", tmp / "up.log")
    try:
        up.wait_ready(300)
        url = up.ready["url"]
        log(f"platform up at {url}; logs in {tmp}")
        services_before = service_pids(up)
        deaths_before = up_metric_total(up, "mindmotor_up_deaths_total")
        lag_before = histogram(metrics_text(up), "mindmotor_coordinator_event_loop_lag_seconds")
        bystanders = Bystanders(url, args.bystanders)
        bystanders.start()
        time.sleep(2.0)
        quiet = len(bystanders.results)
        attackers = Attackers(url, args.attackers)
        attackers.start()
        log(f"attacking for {args.duration:g} s with {args.attackers} threads, {args.bystanders} bystanders")
        deadline = time.monotonic() + args.duration
        while time.monotonic() < deadline:
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
            log(f"{len(attackers.results)} attack requests, {len(bystanders.results)} bystander requests")
        attackers.stop()
        bystanders.stop()
        text = metrics_text(up)
        services_after = service_pids(up)
        deaths = up_metric_total(up, "mindmotor_up_deaths_total") - deaths_before
        lag = [(b, c - dict(lag_before).get(b, 0.0)) for b, c in histogram(text, "mindmotor_coordinator_event_loop_lag_seconds")]
        helper_crashes = counter_sum(text, "mindmotor_helper_tasks_total", outcome="crashed")
        helper_timeouts = counter_sum(text, "mindmotor_helper_tasks_total", outcome="timeout")
    finally:
        up.stop(90)
    return summarize(args, attackers.results, bystanders.results[quiet:], services_before, services_after, deaths,
                     lag, helper_crashes, helper_timeouts)


def summarize(args, attacks, bystanders, before: dict, after: dict, deaths: float, lag, crashes: float,
              timeouts: float) -> dict:
    by_kind: dict[str, Counter] = {}
    for name, status, _ in attacks:
        by_kind.setdefault(name, Counter())[str(status)] += 1
    bad = sum(1 for _, status, _ in attacks if status == 0 or status >= 500)
    latencies = [s for s, _ in bystanders]
    success = sum(ok for _, ok in bystanders) / len(bystanders) if bystanders else 0.0
    died = sorted(before[p] for p in before if p not in after)        # a service whose process changed
    lag_p99 = quantile_bound(lag, 0.99)
    largest = 0.0
    previous = 0.0
    for bound, count in lag:
        if count > previous:
            largest = bound
        previous = count
    result = {
        "benchmark": "abuse", "duration_s": args.duration, "attackers": args.attackers,
        "bystanders": args.bystanders, "workers": args.workers, "coordinators": args.coordinators,
        "timing": args.timing,
        "attack_requests": len(attacks), "attack_by_kind": {k: dict(v) for k, v in by_kind.items()},
        "attack_5xx_or_lost": bad, "helper_crashes": crashes, "helper_timeouts": timeouts,
        "services_died": deaths, "services_replaced": died,
        "bystander_requests": len(bystanders), "bystander_success": round(success, 4),
        "bystander_p50_s": round(percentile(latencies, 0.5), 3), "bystander_p99_s": round(percentile(latencies, 0.99), 3),
        "loop_lag_p99_bucket_s": lag_p99, "loop_lag_largest_bucket_s": largest,
    }
    result["goals_met"] = (bad == 0 and deaths == 0 and not died and success >= 0.99
                           and result["bystander_p99_s"] <= 5.0)
    return result


def print_table(result: dict) -> None:
    print(f"{'attack':36} statuses")
    for name, statuses in result["attack_by_kind"].items():
        print(f"{name:36} {statuses}")
    print(f"\nattack requests {result['attack_requests']}, 5xx or lost {result['attack_5xx_or_lost']}; helper crashes "
          f"{result['helper_crashes']:g}, timeouts {result['helper_timeouts']:g}; services died {result['services_died']:g} "
          f"{result['services_replaced'] or ''}")
    print(f"bystanders: {result['bystander_requests']} requests, success {result['bystander_success']:.2%}, "
          f"p50 {result['bystander_p50_s']} s, p99 {result['bystander_p99_s']} s (goal ≤ 5 s)")
    print(f"coordinator event-loop lag: p99 ≤ {result['loop_lag_p99_bucket_s']} s, largest bucket reached "
          f"{result['loop_lag_largest_bucket_s']} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of attack (default: %(default)s)")
    parser.add_argument("--attackers", type=int, default=4, help="attacking threads (default: %(default)s)")
    parser.add_argument("--bystanders", type=int, default=4, help="bystander clients (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="(default: %(default)s)")
    parser.add_argument("--coordinators", type=int, default=2, help="(default: %(default)s)")
    parser.add_argument("--timing", choices=("realtime", "virtual"), default="realtime", help="(default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="20 s of attack")
    args = parser.parse_args()
    if args.quick:
        args.duration = min(args.duration, 20.0)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    result = run(args)
    print_table(result)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
