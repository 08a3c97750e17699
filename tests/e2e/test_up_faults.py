"""`mindmotor up` heals itself: one platform (controller, deployer with two workers, coordinator) for
the module, configured with explicit ports, API keys and an admin token. Workers are SIGKILLed
during greedy streams (every stream still equals an undisturbed run, the platform answers
throughout, a replacement becomes routable each time); the coordinator, the controller and the
deployer are SIGKILLed (back within seconds, `up` keeps running; the deployer's workers outlive it
and are adopted); a worker is SIGSTOPped during eight greedy streams (they finish elsewhere within
30 s with the undisturbed text; resumed, it is fenced, then serves again); a canary rollout goes through
`mindmotor deploy` against up's deployer; no secret is on any process's command line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import ssl
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from secrets_registry import given_secret
from mindmotor.common.ports import free_ports
from mindmotor.runtime.child_process import ChildProcess
from mindmotor.runtime.proc_tree import descendants

from .conftest import wait_until

API_KEY = given_secret("sk-e2e-up-faults-key")
ADMIN_TOKEN = given_secret("e2e-up-faults-admin-token")
def admin_env(ready: dict[str, str]) -> dict[str, str]:
    """The TLS files of the admin certificate `up` made under its log directory (docs/security.md)."""
    pki = Path(ready["state_dir"]) / "pki"
    return {"MINDMOTOR_TLS_CA": str(pki / "ca.pem"), "MINDMOTOR_TLS_CERT": str(pki / "admin.pem"),
            "MINDMOTOR_TLS_KEY": str(pki / "admin-key.pem")}


def admin_security(ready: dict[str, str]):
    """An in-process client's credentials as that admin."""
    from mindmotor.common.rpc import RpcSecurity

    env = admin_env(ready)
    return RpcSecurity.load(env["MINDMOTOR_TLS_CA"], env["MINDMOTOR_TLS_CERT"], env["MINDMOTOR_TLS_KEY"])


def side_get(ready: dict[str, str], port_key: str, path: str, **kwargs) -> httpx.Response:
    """GET on one of up's HTTP side ports (controller admin, deployer /metrics, up's /metrics):
    HTTPS verified with the cluster CA from up's log directory (common/https_side.py)."""
    context = ssl.create_default_context(cafile=admin_env(ready)["MINDMOTOR_TLS_CA"])
    return httpx.get(f"https://127.0.0.1:{ready[port_key]}{path}", verify=context, timeout=5, **kwargs)


PROMPTS = ["def fibonacci(n):", "import numpy as np\n", "The worker that serves this stream", "class Node:"]
STREAM_TOKENS = 48
BACK_WITHIN_S = 30.0          # generous for a loaded 2-core machine; it is seconds when idle


@pytest.fixture(scope="module")
def platform(e2e_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("up-faults")
    api, controller, admin, deployer, deployer_metrics, metrics = free_ports(6)
    config = {
        "port": api, "state_dir": str(tmp / "state"), "log_dir": str(tmp / "logs"), "api_keys": [API_KEY], "admin_token": ADMIN_TOKEN,
        "ports": {"controller": controller, "controller_admin": admin, "deployer": deployer,
                  "deployer_metrics": deployer_metrics, "metrics": metrics},
        "restart_backoff_s": 0.2, "stable_after_s": 2.0,
        "liveness": {"interval_s": 0.5, "timeout_s": 2.0, "failures": 3},
        # realtime steps of an emulated 7B model: a stream lasts long enough to be killed in
        "models": [{"path": str(e2e_model), "name": "faults", "workers": 2, "timing": "realtime",
                    "emulate": "qwen2-7b", "extra_args": ["--max-model-len", "512"]}],
    }
    (tmp / "up.yaml").write_text(yaml.safe_dump(config))
    up = ChildProcess("up", ["up", "--config", str(tmp / "up.yaml")], "MINDMOTOR_UP_READY", tmp / "up.log")
    try:
        up.wait_ready(240)
        up.config = config
        yield up
    finally:
        assert up.stop(90) == 0


@pytest.fixture(scope="module")
def client(platform):
    return openai.OpenAI(base_url=platform.ready["url"] + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def undisturbed(client, e2e_model):
    return run_streams(client, e2e_model.name)[0]


# ---- helpers ------------------------------------------------------------------------------------
def run_streams(client, model: str, on_started=None) -> tuple[list[str], bool]:
    """Every prompt streamed at once (greedy); `on_started()` runs once each stream has some text.
    Returns the texts and whether every stream was still running when `on_started` ran."""
    texts = [""] * len(PROMPTS)
    started = [threading.Event() for _ in PROMPTS]
    finished = [threading.Event() for _ in PROMPTS]
    errors: list[BaseException] = []

    def stream(i: int) -> None:
        try:
            for chunk in client.completions.create(model=model, prompt=PROMPTS[i], max_tokens=STREAM_TOKENS,
                                                   temperature=0, stream=True, extra_body={"ignore_eos": True}):
                if chunk.choices:
                    texts[i] += chunk.choices[0].text
                    if len(texts[i]) >= 3:
                        started[i].set()
        except BaseException as exc:  # noqa: BLE001 — reported below
            errors.append(exc)
        finally:
            started[i].set()
            finished[i].set()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    in_flight = True
    if on_started is not None:
        for event in started:
            event.wait(60)
        in_flight = not any(event.is_set() for event in finished)
        on_started()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return texts, in_flight


class Prober:
    """Small completions one after the other while it runs; every status code kept."""

    def __init__(self, url: str, model: str):
        self.url, self.model = url, model
        self.codes: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            while not self._stop.is_set():
                try:
                    r = http.post(f"{self.url}/v1/completions", json={
                        "model": self.model, "prompt": "x =", "max_tokens": 2, "temperature": 0})
                    self.codes.append(r.status_code)
                except httpx.HTTPError:
                    self.codes.append(0)
                self._stop.wait(0.05)

    def __enter__(self) -> "Prober":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def service_pids(up: ChildProcess, command: str) -> list[int]:
    """The `mindmotor <command>` processes under up (workers: the deployer's children)."""
    return sorted(p for p in descendants(up.proc.pid) if cmdline(p)[1:4] == ["-m", "mindmotor.cli", command])


def instances(platform) -> dict[str, dict]:
    try:
        r = side_get(platform.ready, "controller_admin_port", "/v1/instances",
                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        return {i["instance_id"]: i for i in r.json()["data"]}
    except (httpx.HTTPError, ValueError, KeyError):
        return {}


def routable(platform) -> set[str]:
    try:
        health = httpx.get(platform.ready["url"] + "/health", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return set()
    return {name for name, i in health.get("instances", {}).items() if i.get("routable")}


def completes(platform, model: str) -> bool:
    try:
        r = httpx.post(platform.ready["url"] + "/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                       json={"model": model, "prompt": "def f(x):", "max_tokens": 2, "temperature": 0}, timeout=10)
        return r.status_code == 200
    except httpx.HTTPError:
        return False


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def up_metric(platform, service: str) -> float:
    """`mindmotor_up_service_up{service}`: 1 once that service printed its ready line."""
    for line in side_get(platform.ready, "metrics_port", "/metrics").text.splitlines():
        if line.startswith(f'mindmotor_up_service_up{{service="{service}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def restarts(platform) -> dict[str, float]:
    text = side_get(platform.ready, "metrics_port", "/metrics").text
    counts = {}
    for line in text.splitlines():
        if line.startswith("mindmotor_up_restarts_total{"):
            counts[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    return counts


# ---- tests ----------------------------------------------------------------------------------------
def test_ports_from_the_config_are_used_and_printed(platform):
    """The ready line (stdout) names every port; each is the config's, and serves."""
    ports, ready = platform.config["ports"], platform.ready
    assert ready["port"] == str(platform.config["port"])
    for key in ("controller", "controller_admin", "deployer", "deployer_metrics", "metrics"):
        assert ready[f"{key}_port"] == str(ports[key])
    assert side_get(ready, "controller_admin_port", "/health").status_code == 200
    assert "mindmotor_deployer" in side_get(ready, "deployer_metrics_port", "/metrics").text
    assert 'mindmotor_up_service_up{service="deployer"} 1.0' in side_get(ready, "metrics_port", "/metrics").text


def test_no_secret_on_any_command_line_and_the_services_use_them(platform, e2e_model):
    pids = descendants(platform.proc.pid)
    assert len(service_pids(platform, "worker")) == 2 and len(pids) >= 5
    for pid in [platform.proc.pid, *pids]:
        line = " ".join(cmdline(pid))
        assert API_KEY not in line and ADMIN_TOKEN not in line and "redis://" not in line
    for pid in service_pids(platform, "worker"):          # workers get an allow-listed environment
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
        names = {item.split("=", 1)[0] for item in environ}
        assert ADMIN_TOKEN not in " ".join(environ) and not names & {"MINDMOTOR_ADMIN_TOKEN", "MINDMOTOR_REDIS_URL",
                                                                      "MINDMOTOR_API_KEYS"}
        assert "PATH" in names
    url = platform.ready["url"]
    body = {"model": e2e_model.name, "prompt": "x", "max_tokens": 1}
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 401
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
    assert side_get(platform.ready, "controller_admin_port", "/v1/instances").status_code == 401
    assert len(instances(platform)) == 2


def test_the_abuse_corpus_is_answered_and_kills_nothing(platform, e2e_model):
    """Issue 19's corpus (specs that crashed the coordinator, a large GBNF grammar, thousands of
    tools, megabyte prompts, a 100,000-deep JSON body), four at a time beside steady small
    completions: each a 200 or a 4xx, no service restarted, every bystander served. Its figures
    (latency, loop lag, at length) are benchmarks/abuse.py's."""
    from concurrent.futures import ThreadPoolExecutor

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.abuse import corpus

    services = {p: cmdline(p) for command in ("coordinator", "controller", "deployer", "worker")
                for p in service_pids(platform, command)}
    attacks = corpus(0, e2e_model.name)

    def attack(item) -> tuple[str, int]:
        name, endpoint, body = item
        r = httpx.post(f"{platform.ready['url']}/v1/{endpoint}", content=body, timeout=120,
                       headers={"content-type": "application/json", "Authorization": f"Bearer {API_KEY}"})
        return name, r.status_code

    with Prober(platform.ready["url"], e2e_model.name) as prober, ThreadPoolExecutor(4) as pool:
        statuses = dict(pool.map(attack, attacks))
    assert all(code == 200 or 400 <= code < 500 for code in statuses.values()), statuses
    assert statuses["lark chain 3,000 rules"] == 400 and statuses["$ref chain 2,500 deep"] == 400
    assert statuses["crashing grammar within limits"] == 400 and statuses["5,000 tools"] == 400
    assert prober.codes and set(prober.codes) == {200}, prober.codes
    assert {p: cmdline(p) for p in services} == services, "a service died or was replaced"


def test_three_worker_kills_during_greedy_streams(platform, client, undisturbed, e2e_model):
    with Prober(platform.ready["url"], e2e_model.name) as prober:
        for round_ in range(3):
            workers = service_pids(platform, "worker")
            assert len(workers) == 2
            victim = workers[round_ % 2]
            victim_id = cmdline(victim)[cmdline(victim).index("--worker-id") + 1]
            address = instances(platform)[victim_id]["address"]
            texts, in_flight = run_streams(client, e2e_model.name, on_started=lambda: kill(victim))
            assert texts == undisturbed and in_flight, f"round {round_}"

            def replaced() -> bool:
                now = instances(platform).get(victim_id, {})
                return now.get("state") == "ready" and now.get("address") != address \
                    and victim_id in routable(platform) and len(routable(platform)) == 2
            wait_until(replaced, timeout=60, interval=0.2, what=f"a routable replacement for {victim_id}")
    assert prober.codes and set(prober.codes) == {200}, prober.codes
    assert platform.alive()


FROZEN_TOKENS = 96
FROZEN_WITHIN_S = 30.0        # the bar: every stream of a SIGSTOPped worker done within this


def stream_once(url: str, model: str, prompt: str, on_text) -> tuple[str, str]:
    """One greedy streamed completion over raw SSE: (the X-MindMotor-Instance that produced its first
    token, its text); `on_text(instance, text)` after each chunk."""
    text = ""
    with httpx.stream("POST", f"{url}/v1/completions", timeout=60, headers={"Authorization": f"Bearer {API_KEY}"},
                      json={"model": model, "prompt": prompt, "max_tokens": FROZEN_TOKENS, "temperature": 0,
                            "stream": True, "ignore_eos": True}) as r:
        assert r.status_code == 200, r.read()
        instance = r.headers["x-mindmotor-instance"]
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            assert "error" not in chunk, chunk
            text += "".join(choice["text"] for choice in chunk["choices"])
            on_text(instance, text)
    return instance, text


def eight_streams(platform, model: str, on_started=None) -> tuple[list[tuple[str, str]], float, bool]:
    """Eight greedy streams at once (each prompt twice). `on_started(instances)` runs once every
    stream has some text, with the instance each one is on. Returns [(instance, text)], the seconds
    from then to the last stream's end, and whether every stream was still running then."""
    prompts = PROMPTS * 2
    results: list = [None] * len(prompts)
    serving: list = [None] * len(prompts)
    started = [threading.Event() for _ in prompts]
    finished = [threading.Event() for _ in prompts]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        def on_text(instance: str, text: str) -> None:
            serving[i] = instance
            if len(text) >= 3:
                started[i].set()
        try:
            results[i] = stream_once(platform.ready["url"], model, prompts[i], on_text)
        except BaseException as exc:  # noqa: BLE001 — reported below
            errors.append(exc)
        finally:
            started[i].set()
            finished[i].set()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for event in started:
        event.wait(60)
    mark = time.monotonic()
    in_flight = not any(event.is_set() for event in finished)
    if on_started is not None:
        on_started(list(serving))
    for t in threads:
        t.join(120)
    assert not errors, errors
    return results, time.monotonic() - mark, in_flight


def coordinator_metric(platform, name: str) -> float:
    text = httpx.get(platform.ready["url"] + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_a_frozen_worker_s_streams_finish_elsewhere_and_it_is_fenced(platform, e2e_model):
    """SIGSTOP the worker serving most of eight greedy streams: every stream finishes within 30 s
    with the text of an undisturbed run. Once SIGCONTed, the worker delivers nothing for the
    abandoned calls (it aborts them; its engine empties), is routable again and serves correctly."""
    model = e2e_model.name
    undisturbed, _, _ = eight_streams(platform, model)
    expected = [text for _, text in undisturbed]
    workers = {cmdline(pid)[cmdline(pid).index("--worker-id") + 1]: pid for pid in service_pids(platform, "worker")}
    assert len(workers) == 2
    stalls_before = coordinator_metric(platform, "mindmotor_coordinator_stream_stalls_total")
    frozen: dict = {}

    def freeze(serving: list[str]) -> None:
        victim = max(workers, key=serving.count)
        log = Path(platform.config["log_dir"]) / "workers" / f"{victim}.log"
        frozen.update(id=victim, pid=workers[victim], streams=serving.count(victim), log=log,
                      log_size=log.stat().st_size)
        os.kill(workers[victim], signal.SIGSTOP)

    try:
        results, elapsed, in_flight = eight_streams(platform, model, on_started=freeze)
        assert in_flight and frozen["streams"] >= 1
        assert [text for _, text in results] == expected
        assert elapsed < FROZEN_WITHIN_S, f"{elapsed:.1f} s"
        stalls = coordinator_metric(platform, "mindmotor_coordinator_stream_stalls_total") - stalls_before
        assert stalls >= frozen["streams"]
        assert frozen["id"] not in routable(platform)                 # fenced while it is frozen
        print(f"frozen worker: {frozen['streams']} of 8 streams moved, {stalls:g} calls given up, "
              f"every stream done {elapsed:.1f} s after SIGSTOP")
    finally:
        if frozen:
            os.kill(frozen["pid"], signal.SIGCONT)
    victim = frozen["id"]

    def back() -> bool:
        record = instances(platform).get(victim, {})
        return record.get("state") == "ready" and record.get("running") == 0 and record.get("waiting") == 0 \
            and victim in routable(platform)
    wait_until(back, timeout=60, interval=0.2, what=f"{victim} ready, idle and routable again")
    with open(frozen["log"]) as f:
        f.seek(frozen["log_size"])
        resumed = f.read()
    assert resumed.count('"request cancelled by the client; aborted"') >= frozen["streams"], resumed[-3000:]
    assert service_pids(platform, "worker") == sorted(workers.values())      # the same processes

    again, _, _ = eight_streams(platform, model)
    assert [text for _, text in again] == expected
    assert victim in {instance for instance, _ in again}                     # it gets traffic again


def test_a_canary_rollout_through_mindmotor_deploy(platform, e2e_model):
    env = {**os.environ, "MINDMOTOR_ADMIN_TOKEN": ADMIN_TOKEN, **admin_env(platform.ready)}
    deployer = f"127.0.0.1:{platform.ready['deployer_port']}"
    deploy = [sys.executable, "-m", "mindmotor.cli", "deploy", "--deployer", deployer]

    def run(*args: str) -> subprocess.CompletedProcess:
        command = [*deploy[:4], args[0], *deploy[4:], *args[1:]]
        return subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)

    done = run("rollout", "faults", "--version", "v2", "--checkpoint", str(e2e_model), "--canary", "50",
               "--replicas", "1", "--json")
    assert done.returncode == 0, done.stderr
    wait_until(lambda: {"faults-v2-0", "faults-v1-0", "faults-v1-1"} <= routable(platform), timeout=60,
               interval=0.2, what="the canary routable")
    assert completes(platform, e2e_model.name)
    done = run("rollback", "faults", "--reason", "e2e")
    assert done.returncode == 0, done.stderr
    wait_until(lambda: "faults-v2-0" not in instances(platform), timeout=60, interval=0.2, what="the canary gone")


def test_a_killed_coordinator_replica_costs_no_retried_request_and_refuses_no_connection(platform, e2e_model):
    """Two coordinator replicas accept from the one socket `up` holds. SIGKILL one under load:
    non-streamed requests from a client that retries on connection errors (the openai SDK's
    default) all succeed, no connection is refused, and the replica is back."""
    replicas = service_pids(platform, "coordinator")
    assert len(replicas) == 2
    before = restarts(platform)
    sdk = openai.OpenAI(base_url=platform.ready["url"] + "/v1", api_key=API_KEY, timeout=30)   # retries: 2
    outcomes: list[str] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                sdk.completions.create(model=e2e_model.name, prompt="def f(x):", max_tokens=8, temperature=0)
                outcomes.append("ok")
            except openai.APIConnectionError as exc:
                outcomes.append(f"connection: {exc.__cause__!r}")
            except openai.APIError as exc:
                outcomes.append(f"error: {exc}")

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: outcomes.count("ok") >= 8, timeout=60, interval=0.1, what="load running")
        kill(replicas[0])
        wait_until(lambda: len(service_pids(platform, "coordinator")) == 2 and replicas[0] not in
                   service_pids(platform, "coordinator") and up_metric(platform, "coordinator-0") == 1.0,
                   timeout=BACK_WITHIN_S, interval=0.1, what="the killed replica back")
        served = len(outcomes)
        wait_until(lambda: len(outcomes) >= served + 8, timeout=60, interval=0.1, what="load after the restart")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert set(outcomes) == {"ok"}, [o for o in outcomes if o != "ok"][:5]
    assert restarts(platform)["coordinator-0"] == before.get("coordinator-0", 0) + 1
    assert platform.alive()


def test_a_stream_cut_by_a_replica_s_death_resumes_on_another(platform, e2e_model):
    """SIGKILL the coordinator replica serving a greedy stream; the client sends the same request
    again with `Last-Event-ID` (to the same port: another replica answers) and gets the rest — the
    joined text equals an undisturbed run, nothing repeated or missing (coordinator/dispatch/resume.py)."""
    url, headers = platform.ready["url"], {"Authorization": f"Bearer {API_KEY}"}
    request = {"model": e2e_model.name, "prompt": "def fibonacci(n):", "max_tokens": 80, "temperature": 0,
               "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=request, headers=headers, timeout=60) as r:
        undisturbed = "".join(text for _, text in sse_texts(r))
    got, last_id = "", None
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{url}/v1/completions", json=request, headers=headers) as r:
            events = sse_texts(r)
            for event_id, text in events:
                got, last_id = got + text, event_id
                if len(got) >= 10:
                    break
            serving = [pid for streams, pid in replica_streams(platform) if streams]
            assert len(serving) == 1, serving
            kill(serving[0])
            try:
                for event_id, text in events:                 # what was in flight before the kill
                    got, last_id = got + text, event_id
            except httpx.HTTPError:
                pass
    assert got != undisturbed, "the stream ended before the replica died"
    with httpx.stream("POST", f"{url}/v1/completions", json=request, timeout=60,
                      headers={**headers, "Last-Event-ID": last_id}) as r:
        assert r.status_code == 200, r.read()
        rest = "".join(text for _, text in sse_texts(r))
    assert got + rest == undisturbed


def sse_texts(response: httpx.Response):
    """(event id, text) of each completion event of a stream."""
    event_id = None
    for line in response.iter_lines():
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: ") and line != "data: [DONE]":
            choices = json.loads(line[6:]).get("choices") or [{}]
            yield event_id, choices[0].get("text") or ""


def replica_streams(platform) -> list[tuple[int, int]]:
    """(streams in flight, pid) of each coordinator replica, read on its own port."""
    out = []
    for port in platform.ready["coordinator_ports"].split(","):
        replica = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()["replica"]
        out.append((replica["streams_in_flight"], replica["pid"]))
    return out


def test_the_controller_comes_back_after_sigkill(platform, e2e_model):
    before = restarts(platform)
    (pid,) = service_pids(platform, "controller")
    kill(pid)
    wait_until(lambda: service_pids(platform, "controller") not in ([], [pid]) and completes(platform, e2e_model.name),
               timeout=BACK_WITHIN_S, interval=0.2, what="the controller back")
    assert platform.alive()
    wait_until(lambda: {i["state"] for i in instances(platform).values()} == {"ready"}
               and len(instances(platform)) == 2, timeout=BACK_WITHIN_S, interval=0.2,
               what="both workers registered again")
    assert restarts(platform)["controller"] == before.get("controller", 0) + 1


def test_a_frozen_controller_is_killed_and_restarted(platform, e2e_model):
    """SIGSTOP: alive but answering nothing. Its liveness probe fails, up SIGKILLs and restarts it."""
    (pid,) = service_pids(platform, "controller")
    before = restarts(platform).get("controller", 0)
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: service_pids(platform, "controller") not in ([], [pid]), timeout=BACK_WITHIN_S,
                   interval=0.2, what="the frozen controller replaced")
    finally:
        if os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGCONT)
    wait_until(lambda: completes(platform, e2e_model.name) and len(instances(platform)) == 2,
               timeout=BACK_WITHIN_S, interval=0.2, what="the platform serving with both workers again")
    text = side_get(platform.ready, "metrics_port", "/metrics").text
    assert 'mindmotor_up_liveness_kills_total{service="controller"} 1.0' in text
    assert restarts(platform)["controller"] == before + 1
    assert platform.alive()


def test_a_killed_deployer_is_restarted_and_adopts_its_workers(platform, e2e_model):
    """The workers outlive the deployer (they are up's): the same processes serve throughout, every
    request succeeds, and the restarted deployer (in memory: up applies the deployment again)
    adopts them instead of starting new ones."""
    from mindmotor.deployer.client import DeployerClient

    (deployer,) = service_pids(platform, "deployer")
    workers = service_pids(platform, "worker")
    addresses = {i: v["address"] for i, v in instances(platform).items()}
    before = restarts(platform).get("deployer", 0)

    def adopted() -> bool:
        if service_pids(platform, "deployer") in ([], [deployer]):
            return False
        try:
            with DeployerClient(f"127.0.0.1:{platform.ready['deployer_port']}", ADMIN_TOKEN, timeout_s=3,
                                sec=admin_security(platform.ready)) as c:
                version = c.get("faults").versions[0]
        except Exception:  # noqa: BLE001 — not back yet
            return False
        return (version.version, version.running, version.ready, version.restarts) == ("v1", 2, 2, 0)

    with Prober(platform.ready["url"], e2e_model.name) as prober:
        kill(deployer)
        wait_until(adopted, timeout=BACK_WITHIN_S, interval=0.2, what="the restarted deployer running both workers")
        assert completes(platform, e2e_model.name)
    assert service_pids(platform, "worker") == workers
    assert {i: v["address"] for i, v in instances(platform).items()} == addresses
    assert prober.codes and set(prober.codes) == {200}, prober.codes
    log = (Path(platform.config["log_dir"]) / "deployer.log").read_text()
    assert log.count('"replica adopted"') >= 2
    assert platform.alive()
    assert restarts(platform)["deployer"] == before + 1
