"""Fault injection against `mindmotor up`: steady request load while workers, the controller, the
coordinator, the deployer and Redis are killed (SIGKILL) or frozen (SIGSTOP, then SIGCONT).

One `mindmotor up` on 127.0.0.1 (2 workers of a tiny random-weight model emulating Qwen2-7B on a
910B3 in realtime, two coordinator replicas, API keys with a rate limit, so every request also goes
through Redis) and its own `redis-server` on a free port (never the shared one: it gets killed). C
closed-loop clients send greedy completions (`max_tokens` 8) one after the other, each with a 30 s
timeout, for the whole run, through the openai SDK with its default retries on connection errors
(2) — half of them non-streamed, half streamed (`--streams` sets how many stream). The faults come one after the other; each owns the time from its injection until the next
one's: `--window` seconds, then until the platform is whole again (every worker routable, a
request answered; at most 60 s more), then 1 s.

Per fault: requests sent (in its window), succeeded (2xx), 4xx, 5xx, lost (no complete answer
after the SDK's retries: reset, timeout, a stream cut), of them streams and non-streamed, refused
connections, and the longest outage — the longest time between two successive successful answers
(across all clients) that overlaps its window. The baseline row shows what that gap is without a
fault. The coordinator fault SIGKILLs one replica; its row also has `in_flight_on_killed` (the
requests and streams that replica had open, read from its own port just before the kill: what
its death can cost at most) and `replica_restored_s` (from the kill until `up` has it serving
again).

    .venv/bin/python benchmarks/faults.py                   # about 3 minutes
    .venv/bin/python benchmarks/faults.py --quick           # fewer faults, shorter windows

Bounded: a fixed list of faults, each once (workers twice), `--window` seconds each, loopback only.
Progress on stderr; a table, then ONE JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx
import yaml

from mindmotor.common.ports import free_port
from mindmotor.runtime.child_process import ChildProcess
from mindmotor.runtime.proc_tree import descendants

API_KEY = "sk-faults-benchmark"
REQUEST_TIMEOUT_S = 30.0
RECOVER_TIMEOUT_S = 60.0


def log(msg: str) -> None:
    print(f"[faults] {msg}", file=sys.stderr, flush=True)


# ---- the processes ------------------------------------------------------------------------------
class Redis:
    """A private redis-server (no persistence: a restart comes back empty)."""

    def __init__(self, port: int, log_dir: Path):
        self.port, self.log_dir, self.child, self.starts = port, log_dir, None, 0

    def start(self) -> None:
        self.starts += 1
        self.child = ChildProcess("redis", ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                            "--appendonly", "no"], "__no_ready_line__",
                                  self.log_dir / f"redis-{self.starts}.log", program=["redis-server"])
        deadline = time.monotonic() + 30
        while not self.ping():
            if time.monotonic() > deadline or not self.child.alive():
                raise RuntimeError(f"redis-server did not start on {self.port}")
            time.sleep(0.05)

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    @property
    def pid(self) -> int:
        return self.child.proc.pid


def _arg(pid: int, flag: str) -> str:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return args[args.index(flag) + 1]


def _service_up(up: ChildProcess, service: str) -> bool:
    """up's own /metrics: `mindmotor_up_service_up{service}` is 1 (it printed its ready line)."""
    import ssl

    context = ssl.create_default_context(cafile=str(Path(up.ready["state_dir"]) / "pki" / "ca.pem"))
    try:
        text = httpx.get(f"https://127.0.0.1:{up.ready['metrics_port']}/metrics", verify=context, timeout=3).text
    except httpx.HTTPError:
        return False
    return f'mindmotor_up_service_up{{service="{service}"}} 1.0' in text


def _alive_pids(pids: list[int]) -> list[int]:
    return [p for p in pids if Path(f"/proc/{p}").exists()]


def service_pids(up: ChildProcess, command: str) -> list[int]:
    pids = []
    for pid in descendants(up.proc.pid):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args[1:4] == [b"-m", b"mindmotor.cli", command.encode()]:
            pids.append(pid)
    return sorted(pids)


# ---- the load -----------------------------------------------------------------------------------
@dataclass
class Result:
    sent: float
    done: float
    status: int            # 0: no complete answer
    stream: bool = False
    refused: bool = False  # the connection was refused (after the SDK's retries)


class Load:
    def __init__(self, url: str, model: str, clients: int, streams: int):
        self.url, self.model, self.clients = url, model, clients
        self.results: list[Result] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i, i < streams), daemon=True)
                         for i in range(clients)]

    def _client(self, index: int, stream: bool) -> None:
        import openai

        n = 0
        sdk = openai.OpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, timeout=REQUEST_TIMEOUT_S)  # 2 retries
        while not self._stop.is_set():
            n += 1
            sent = time.monotonic()
            status, refused = 200, False
            try:
                out = sdk.completions.create(model=self.model, prompt=f"client {index} request {n}: def f(x):",
                                             max_tokens=8, temperature=0, stream=stream)
                if stream:
                    finished = [c.choices[0].finish_reason for c in out if c.choices]
                    status = 200 if finished and finished[-1] else 0
            except openai.APIStatusError as exc:
                status = exc.status_code
            except (openai.APIConnectionError, httpx.HTTPError) as exc:
                status = 0
                refused = isinstance(exc.__cause__, httpx.ConnectError) or isinstance(exc, httpx.ConnectError)
            with self._lock:
                self.results.append(Result(sent, time.monotonic(), status, stream, refused))
            if status != 200:
                self._stop.wait(0.05)          # a refused connection is instant: do not spin

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(REQUEST_TIMEOUT_S + 5)

    def snapshot(self) -> list[Result]:
        with self._lock:
            return list(self.results)


def summarize(name: str, results: list[Result], start: float, end: float) -> dict:
    mine = [r for r in results if start <= r.sent < end]
    ok = sorted(r.done for r in results if r.status == 200)
    outage = 0.0
    for a, b in zip(ok, ok[1:]):
        if b > start and a < end:
            outage = max(outage, b - a)
    lost = [r for r in mine if r.status == 0]
    return {"fault": name, "sent": len(mine), "succeeded": sum(r.status == 200 for r in mine),
            "4xx": sum(400 <= r.status < 500 for r in mine), "5xx": sum(r.status >= 500 for r in mine),
            "lost": len(lost), "lost_streams": sum(r.stream for r in lost),
            "lost_non_streamed": sum(not r.stream for r in lost), "refused": sum(r.refused for r in mine),
            "longest_outage_s": round(outage, 3), "window_s": round(end - start, 2)}


# ---- the run ------------------------------------------------------------------------------------
@dataclass
class Fault:
    name: str
    inject: Callable[[], dict | None]       # may return figures for the fault's row
    recover: Callable[[], None] = lambda: None
    hold_s: float = 0.0                     # SIGSTOP: frozen this long, then recover()


@dataclass
class Bench:
    up: ChildProcess
    redis: Redis
    workers: int
    model: str
    frozen: list[int] = field(default_factory=list)

    def pid(self, command: str, index: int = 0) -> int:
        pids = service_pids(self.up, command)
        if not pids:
            raise RuntimeError(f"no {command} process under up")
        return pids[index % len(pids)]

    def kill(self, command: str, index: int = 0) -> Callable[[], None]:
        return lambda: os.kill(self.pid(command, index), signal.SIGKILL)

    def freeze(self, pid_of: Callable[[], int]) -> tuple[Callable[[], None], Callable[[], None]]:
        def inject():
            self.frozen.append(pid_of())
            os.kill(self.frozen[-1], signal.SIGSTOP)

        def recover():
            os.kill(self.frozen.pop(), signal.SIGCONT)
        return inject, recover

    def kill_coordinator_replica(self) -> dict:
        """SIGKILL coordinator replica 0, after reading what it has in flight from its own port; the
        row gets `in_flight_on_killed` and, once up has it serving again, `replica_restored_s`."""
        port = self.up.ready["coordinator_ports"].split(",")[0]
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()["replica"]
        pid = health["pid"]
        name = _arg(pid, "--coordinator-id").removeprefix("up-")
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        restored = None
        while time.monotonic() < killed + RECOVER_TIMEOUT_S:
            replaced = any(p != pid and f"up-{name}" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")
                           for p in _alive_pids(service_pids(self.up, "coordinator")))
            if replaced and _service_up(self.up, name):
                restored = round(time.monotonic() - killed, 2)
                break
            time.sleep(0.05)
        return {"in_flight_on_killed": {"requests": health["requests_in_flight"],
                                        "streams": health["streams_in_flight"]},
                "replica_restored_s": restored}

    def whole(self) -> bool:
        url = self.up.ready["url"]
        try:
            health = httpx.get(f"{url}/health", timeout=3).json()
            routable = sum(1 for i in health.get("instances", {}).values() if i.get("routable"))
            r = httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10,
                           json={"model": self.model, "prompt": "x", "max_tokens": 1})
            return routable >= self.workers and r.status_code == 200 and self.redis.ping()
        except (httpx.HTTPError, ValueError):
            return False


def faults(bench: Bench, quick: bool, hold_s: float) -> list[Fault]:
    def redis_kill():
        os.kill(bench.redis.pid, signal.SIGKILL)
        bench.redis.child.proc.wait()
        bench.redis.start()                          # back at once, empty

    worker_stop, worker_cont = bench.freeze(lambda: bench.pid("worker"))
    controller_stop, controller_cont = bench.freeze(lambda: bench.pid("controller"))
    redis_stop, redis_cont = bench.freeze(lambda: bench.redis.pid)
    chosen = [
        Fault("baseline", lambda: None),
        Fault("worker SIGKILL", bench.kill("worker", 0)),
        Fault("worker SIGKILL (again)", bench.kill("worker", 1)),
        Fault(f"worker SIGSTOP {hold_s:g} s", worker_stop, worker_cont, hold_s),
        Fault("controller SIGKILL", bench.kill("controller")),
        Fault(f"controller SIGSTOP {hold_s:g} s", controller_stop, controller_cont, hold_s),
        Fault(f"redis SIGSTOP {hold_s:g} s", redis_stop, redis_cont, hold_s),
        Fault("redis SIGKILL + restart empty", redis_kill),
        Fault("coordinator replica SIGKILL", bench.kill_coordinator_replica),
        Fault("deployer SIGKILL", bench.kill("deployer")),
    ]
    if quick:
        keep = {"baseline", "worker SIGKILL", "controller SIGKILL", "redis SIGKILL + restart empty",
                "coordinator replica SIGKILL"}
        chosen = [f for f in chosen if f.name in keep]
    return chosen


def run(args: argparse.Namespace) -> dict:
    from mindmotor.model.testing import write_tiny_checkpoint

    tmp = Path(tempfile.mkdtemp(prefix="mindmotor-faults-"))
    model_dir = Path(args.model) if args.model else write_tiny_checkpoint(tmp / "faults-model")
    redis = Redis(free_port(), tmp)
    redis.start()
    config = {"port": 0, "state_dir": str(tmp / "state"), "log_dir": str(tmp / "logs"), "api_keys": [API_KEY], "rate_limit_rpm": 1_000_000,
              "redis_url": f"redis://127.0.0.1:{redis.port}/0", "redis_prefix": "mindmotor-faults:",
              "restart_backoff_s": 0.2,
              "models": [{"path": str(model_dir), "name": "faults", "workers": args.workers, "timing": "realtime",
                          "emulate": "qwen2-7b", "extra_args": ["--max-model-len", "512"]}]}
    (tmp / "up.yaml").write_text(yaml.safe_dump(config))
    up = ChildProcess("up", ["up", "--config", str(tmp / "up.yaml")], "MINDMOTOR_UP_READY", tmp / "up.log")
    rows: list[dict] = []
    bench = Bench(up, redis, args.workers, model_dir.name)
    try:
        up.wait_ready(300)
        log(f"platform up at {up.ready['url']}; logs in {tmp}")
        load = Load(up.ready["url"], model_dir.name, args.clients, args.streams)
        load.start()
        time.sleep(2.0)                                     # the load reaches its steady state
        for fault in faults(bench, args.quick, args.hold):
            start = time.monotonic()
            log(f"{fault.name} ...")
            figures = fault.inject() or {}
            if fault.hold_s:
                time.sleep(fault.hold_s)
                fault.recover()
            time.sleep(max(0.0, start + args.window - time.monotonic()))
            deadline = time.monotonic() + RECOVER_TIMEOUT_S
            while not bench.whole() and time.monotonic() < deadline:
                time.sleep(0.2)
            recovered = bench.whole()
            time.sleep(1.0)
            row = summarize(fault.name, load.snapshot(), start, time.monotonic())
            row["recovered"] = recovered
            row.update(figures)
            rows.append(row)
            log(json.dumps(row))
            if not up.alive():
                log("mindmotor up exited: stopping the run")
                break
        load.stop()
        results = load.snapshot()
        total = summarize("all", results, min((r.sent for r in results), default=0.0), time.monotonic())
        up_alive = up.alive()
    finally:
        for pid in bench.frozen:
            os.kill(pid, signal.SIGCONT)
        up.stop(90)
        redis.child.stop(10)
    return {"benchmark": "faults", "clients": args.clients, "workers": args.workers, "window_s": args.window,
            "hold_s": args.hold, "faults": rows, "total": total, "up_survived": up_alive,
            "longest_outage_s": max((r["longest_outage_s"] for r in rows if r["fault"] != "baseline"), default=0.0)}


def print_table(result: dict) -> None:
    head = (f"{'fault':34} {'sent':>6} {'ok':>6} {'4xx':>5} {'5xx':>5} {'lost':>5} {'(strm':>5} {'non)':>5} "
            f"{'refus':>5} {'outage s':>9} recovered")
    print(head)
    print("-" * len(head))
    for r in [*result["faults"], result["total"]]:
        print(f"{r['fault']:34} {r['sent']:6d} {r['succeeded']:6d} {r['4xx']:5d} {r['5xx']:5d} {r['lost']:5d} "
              f"{r['lost_streams']:5d} {r['lost_non_streamed']:5d} {r['refused']:5d} {r['longest_outage_s']:9.2f} "
              f"{r.get('recovered', '')}")
        if "in_flight_on_killed" in r:
            print(f"{'':34} in flight on the killed replica: {r['in_flight_on_killed']}; "
                  f"back serving after {r['replica_restored_s']} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4, help="closed-loop clients (default: %(default)s)")
    parser.add_argument("--streams", type=int, default=None,
                        help="of the clients, how many stream (default: half)")
    parser.add_argument("--workers", type=int, default=2, help="(default: %(default)s)")
    parser.add_argument("--window", type=float, default=10.0,
                        help="seconds each fault's window lasts at least (default: %(default)s)")
    parser.add_argument("--hold", type=float, default=5.0, help="seconds a SIGSTOP lasts (default: %(default)s)")
    parser.add_argument("--model", default=None, help="checkpoint (default: a tiny random-weight one)")
    parser.add_argument("--quick", action="store_true", help="five faults, 5 s windows")
    args = parser.parse_args()
    if args.quick:
        args.window = min(args.window, 5.0)
    if args.streams is None:
        args.streams = args.clients // 2
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    result = run(args)
    print_table(result)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
