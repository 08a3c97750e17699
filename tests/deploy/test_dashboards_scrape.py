"""The Grafana dashboards against a real Prometheus scrape: a worker (a small KV pool, so that
requests preempt each other) and a coordinator serve traffic — plain, streamed, structured,
completions, a repeated prompt for prefix-cache hits — in two rounds with a scrape after each (a
rate needs two samples), a real `prometheus` scrapes both /metrics with the jobs of
deploy/prometheus/prometheus.yml, and every panel query of the vLLM dashboard, Grafana variables
substituted, must return a finite value. Of our overview dashboard, every panel whose series the
coordinator and worker export returns data too; the others need services this test does not run
(controller, deployer, a P/D pair, a second version) or events it does not cause (retries,
rejections), and the test says which."""

from __future__ import annotations

import math
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from mindmotor.common.ports import free_port
from mindmotor.common.waiting import wait_until
from mindmotor.runtime.child_process import ChildProcess
from service_processes import WorkerProcess

from . import artifacts as A

PROMETHEUS = shutil.which("prometheus")
SCRAPE_INTERVAL = "1s"
RATE_INTERVAL = "2m"                      # $__rate_interval: the whole test, every scrape of it
VLLM = A.GRAFANA / "dashboards" / "mindmotor-vllm.json"
OVERVIEW = A.GRAFANA / "dashboards" / "mindmotor-overview.json"
# Overview panels that plain traffic on one coordinator and one worker cannot fill, by series.
NEEDS_MORE = {
    "mindmotor_coordinator_rejected_total": "a request refused before routing (auth, rate limit, overload)",
    "mindmotor_coordinator_retries_total": "a worker failing mid-request",
    "mindmotor_coordinator_migrations_total": "a worker draining mid-request",
    "mindmotor_coordinator_pd_prefills_total": "a P/D pair of workers",
    "mindmotor_coordinator_pd_fallbacks_total": "a P/D pair of workers",
    "mindmotor_kv_transfers_total": "a P/D pair of workers",
    "mindmotor_kv_transfer_bytes_total": "a P/D pair of workers",
    "mindmotor_coordinator_version_errors_total": "a deployment with versions (the deployer)",
    "mindmotor_coordinator_version_requests_total": "a deployment with versions (the deployer)",
    "mindmotor_coordinator_version_time_to_first_token_seconds_bucket": "a deployment with versions (the deployer)",
}

@pytest.fixture(scope="module")
def serving(tiny_ckpt, tmp_path_factory):
    """(coordinator address, worker metrics address), both real processes: a worker whose 24 blocks
    of 4 tokens hold two of the traffic's long requests, not four, and a coordinator over it."""
    if PROMETHEUS is None:      # a failure, not a skip: the dashboards would go unchecked
        pytest.fail("the prometheus binary is not installed (.ci/run installs it: apt-get install prometheus)")
    logs = tmp_path_factory.mktemp("dashboard-logs")
    started = []

    def start(name: str, args: list[str], ready: str) -> dict[str, str]:
        started.append(ChildProcess(name, args, ready, logs / f"{name}.log"))
        return started[-1].wait_ready(60)

    worker = None
    try:
        worker = WorkerProcess(tiny_ckpt, logs / "worker.log", "--timing", "virtual", "--block-size", "4",
                               "--num-blocks", "24").wait_ready()
        coordinator = start("coordinator", ["coordinator", "--host", "127.0.0.1", "--port", "0", "--worker",
                                            worker.address, "--model-dir", str(tiny_ckpt)],
                            "MINDMOTOR_COORDINATOR_READY")
        yield f"127.0.0.1:{coordinator['port']}", f"127.0.0.1:{worker.metrics_port}"
    finally:
        for child in started:
            child.kill()
        if worker is not None:
            worker.stop()


@pytest.fixture(scope="module")
def prometheus(serving, tmp_path_factory):
    """A real Prometheus scraping the coordinator and the worker every second; its query URL."""
    coordinator, worker_metrics = serving
    tmp = tmp_path_factory.mktemp("prometheus")
    shipped = {job["job_name"]: job for job in A.load_yaml(A.PROMETHEUS_COMPOSE)["scrape_configs"]}
    targets = {"mindmotor-coordinator": coordinator, "mindmotor-worker": worker_metrics}
    jobs = [{**shipped[name], "static_configs": [{"targets": [target], "labels": shipped[name]["static_configs"][0]
                                                  ["labels"]}]} for name, target in targets.items()]
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_INTERVAL},
                                      "scrape_configs": jobs}))
    port = free_port()
    with open(tmp / "prometheus.log", "w") as log:
        proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url) or proc.poll() is not None, timeout=30, what="prometheus ready")
        assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-2000:]
        yield url
    finally:
        proc.kill()
        proc.wait()


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def query(url: str, expr: str) -> list[dict]:
    r = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=10)
    assert r.status_code == 200, f"{expr}: {r.text}"
    return r.json()["data"]["result"]


def exported_total(metrics_url: str, sample: str) -> float:
    """The sum of a sample's values on a target's /metrics now."""
    text = httpx.get(metrics_url, timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples if s.name == sample)


def wait_until_scraped(url: str, targets: dict[str, str], sample: str = "vllm:generation_tokens_total") -> None:
    """Until Prometheus holds, for every job, the value its target exports now (a scrape under
    load can fail; a successful one after the traffic is what counts)."""
    for job, address in targets.items():
        want = exported_total(f"http://{address}/metrics", sample)

        def caught_up() -> bool:                   # (no series yet counts as 0)
            rows = query(url, f'sum({sample}{{job="{job}"}}) or sum(up{{job="{job}"}} == 1) * 0')
            return bool(rows) and float(rows[0]["value"][1]) == want
        wait_until(caught_up, timeout=60, interval=0.2, what=f"prometheus to scrape {job}'s {sample} = {want}")


def traffic(base_url: str, model: str) -> None:
    """Every kind of request the dashboards' series count, with preemptions and prefix-cache hits."""
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        chat = dict(model=model, messages=[{"role": "user", "content": "the weather in Lima"}], max_tokens=8)
        client.chat.completions.create(**chat)
        for _ in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **chat):
            pass
        schema = {"type": "object", "properties": {"city": {"enum": ["Lima", "Paris"]}}, "required": ["city"]}
        for _ in client.chat.completions.create(
                stream=True, response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
                **chat):
            pass
        shared = "a long shared prefix that the prefix cache keeps between requests " * 2
        for i in range(2):
            client.completions.create(model=model, prompt=shared + str(i), max_tokens=4)
        long = dict(model=model, max_tokens=36, extra_body={"ignore_eos": True})
        with ThreadPoolExecutor(4) as pool:      # 4 × ~40 tokens of KV in a pool of 96: preemptions
            list(pool.map(lambda i: client.completions.create(prompt=f"request {i}", **long), range(4)))


def substituted(expr: str, variables: dict[str, str]) -> str:
    for name, value in variables.items():
        expr = expr.replace("$" + name, value)
    return expr.replace("$__rate_interval", RATE_INTERVAL)


def template_values(url: str, dashboard: dict) -> dict[str, str]:
    """Each query variable's first value, as Grafana would offer it (label_values(series, label))."""
    values = {}
    for var in dashboard.get("templating", {}).get("list", []):
        text = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        series, label = text.removeprefix("label_values(").removesuffix(")").split(", ")
        r = httpx.get(f"{url}/api/v1/label/{label}/values", params={"match[]": series}, timeout=10).json()
        assert r["data"], f"variable {var['name']}: {text} has no values"
        values[var["name"]] = r["data"][0]
    return values


@pytest.fixture(scope="module")
def scraped(serving, prometheus, tiny_ckpt):
    targets = {"mindmotor-coordinator": serving[0], "mindmotor-worker": serving[1]}
    wait_until_scraped(prometheus, targets)                      # both scraped before the traffic
    for _ in range(2):                                            # rates need a sample before and after
        traffic(f"http://{serving[0]}/v1", tiny_ckpt.name)
        wait_until_scraped(prometheus, targets)
    return prometheus


def finite(rows: list[dict]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in rows)


def test_every_vllm_dashboard_panel_has_data_after_traffic(scraped):
    dashboard = A.load_dashboard(VLLM)
    variables = template_values(scraped, dashboard)
    panels = list(A.dashboard_queries(dashboard))
    empty = [(where, expr) for where, expr, _ in panels if not finite(query(scraped, substituted(expr, variables)))]
    assert not empty, f"{len(empty)} of {len(panels)} panel queries return no data: {empty}"
    # the traffic really moved the series that only move on events
    assert float(query(scraped, f"sum(increase(vllm:num_preemptions_total[{RATE_INTERVAL}]))")[0]["value"][1]) > 0
    assert float(query(scraped, f"sum(increase(vllm:prefix_cache_hits_total[{RATE_INTERVAL}]))")[0]["value"][1]) > 0


def test_every_overview_panel_on_coordinator_and_worker_series_has_data(scraped):
    dashboard = A.load_dashboard(OVERVIEW)
    variables = template_values(scraped, dashboard)
    ours = _series_of_services(("coordinator", "worker"))
    checked, empty, elsewhere = 0, [], []
    for where, expr, _ in A.dashboard_queries(dashboard):
        metrics = A.parse_promql(expr).metrics
        if not metrics <= ours or metrics & set(NEEDS_MORE):
            elsewhere.append(where)
            continue
        checked += 1
        if not finite(query(scraped, substituted(expr, variables))):
            empty.append((where, expr))
    assert not empty, f"{len(empty)} of {checked} panel queries return no data: {empty}"
    print(f"overview: {checked} panel queries checked, {len(elsewhere)} need other services or events: {elsewhere}")
    assert checked >= 25 and len(elsewhere) <= 25, (checked, elsewhere)


def _series_of_services(services: tuple[str, ...]) -> set[str]:
    return {series for f in A.registered_metrics().values() if f.service in services for series in f.sample_names()}
