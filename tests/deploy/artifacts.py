"""Readers for the deployment artifacts (Dockerfile, docker-compose.yml, deploy/) and the facts the
tests hold them to: the real CLI parser, the metrics the services really register, PromQL names.

Nothing here needs Docker, Kubernetes, Prometheus or the network.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
COMPOSE_FILE = ROOT / "docker-compose.yml"
DEPLOY = ROOT / "deploy"
K8S_DIR = DEPLOY / "kubernetes"
PROMETHEUS_COMPOSE = DEPLOY / "prometheus" / "prometheus.yml"
PROMETHEUS_K8S = DEPLOY / "prometheus" / "prometheus-kubernetes.yml"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
GRAFANA = DEPLOY / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))

IMAGE = "mindmotor"                       # the image name of docker-compose.yml / the manifests
IMAGE_MODEL_DIR = "/models/mindmotor-demo"  # the bundled model's stable path, made by the Dockerfile
NAMESPACE = "mindmotor"

# Labels Prometheus attaches to every scraped series (scrape config + relabelling); a metric's own
# label of the same name is renamed exported_<name> at scrape time (honor_labels: false).
TARGET_LABELS = {"job", "instance", "service", "pod", "node"}
PROMETHEUS_OWN_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


def load_yaml_all(path: Path) -> list:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


# ---- the CLI ---------------------------------------------------------------------------------

class CLIError(Exception):
    pass


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """Exactly the container's MINDMOTOR_* variables (the parsers read some at build time)."""
    saved = dict(os.environ)
    try:
        for key in [k for k in os.environ if k.startswith("MINDMOTOR_")]:
            del os.environ[key]
        os.environ.update(env)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def parse_cli(argv: list[str], env: dict[str, str] | None = None) -> argparse.Namespace:
    """Parse `mindmotor ARGV` with the real parser (mindmotor.cli.build_parser), in the container's
    environment. CLIError with argparse's message for an unknown flag or a bad value."""
    from mindmotor.cli import build_parser

    stderr = io.StringIO()
    with environment(env or {}), contextlib.redirect_stderr(stderr):
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:
            raise CLIError(f"mindmotor {' '.join(argv)}: {stderr.getvalue().strip()}") from exc
    if not getattr(args, "func", None):
        raise CLIError(f"mindmotor {' '.join(argv)}: no subcommand")
    return args


@dataclass
class ServiceArgs:
    """One mindmotor container: where it was declared, its argv, environment and parsed flags."""
    where: str                  # "compose:worker-1" / "kubernetes:worker.yaml/mindmotor-worker/worker"
    name: str                   # compose service / workload name
    argv: list[str]
    env: dict[str, str]
    args: argparse.Namespace = field(repr=False)

    @property
    def command(self) -> str:
        return self.args.command

    @functools.cached_property
    def settings(self):
        """The service's settings as the container loads them: its flags, then its environment
        (then its --config file: the coordinator's)."""
        if self.command == "coordinator":
            return coordinator_settings(self)
        module = importlib.import_module(f"mindmotor.{self.command}.cli")
        with environment(self.env):
            return module.config_from_args(self.args)

    def listening_ports(self) -> dict[str, int]:
        """What the service listens on, from its settings: {"grpc"|"admin"|"http"|"metrics": port}."""
        if self.command == "worker":
            return {"grpc": self.settings.port, "metrics": self.settings.metrics_port}
        if self.command == "controller":
            return {"grpc": self.settings.port, "admin": self.settings.admin_port}
        if self.command == "coordinator":
            return {"http": coordinator_port(self)}
        raise AssertionError(f"{self.where}: unexpected subcommand {self.command}")

    def metrics_port(self) -> int:
        ports = self.listening_ports()
        return ports.get("metrics") or ports.get("admin") or ports["http"]


def coordinator_port(service: ServiceArgs) -> int:
    if service.args.port is not None:
        return service.args.port
    settings = coordinator_settings(service)
    return settings.port


def map_image_paths(text: str) -> str:
    """Image paths -> this checkout's files, so settings that check paths can be loaded here."""
    from mindmotor.model.checkpoint import BUNDLED_MODEL_DIR

    return text.replace(IMAGE_MODEL_DIR, str(BUNDLED_MODEL_DIR))


CONFIG_FILES: dict[str, str] = {}   # container path -> text (k8s ConfigMap mounts), filled by k8s readers
SECRET_MOUNTS: dict[str, str] = {}  # container directory -> Secret name (k8s Secret volumes), likewise
SECRET_FILE_SETTINGS = ("api_key_file", "redis_url_file", "https_cert", "https_key")


def _stand_in_secret_files(args: argparse.Namespace, tmp: Path, where: str) -> None:
    """Every secret file flag that names a file in a mounted Secret -> a stand-in file (the Secret is
    created by the operator, its content is not in the repository); any other path must exist."""
    for name in SECRET_FILE_SETTINGS:
        path = getattr(args, name, None)
        if path is None:
            continue
        mount = next((m for m in SECRET_MOUNTS if path.startswith(m.rstrip("/") + "/")), None)
        if mount is None:
            if not Path(path).is_file():
                raise AssertionError(f"{where}: --{name.replace('_', '-')} {path} is not in a mounted Secret")
            continue
        stand_in = tmp / "secrets" / path.lstrip("/")
        stand_in.parent.mkdir(parents=True, exist_ok=True)
        stand_in.write_text("from-a-secret\n")
        setattr(args, name, str(stand_in))


def coordinator_settings(service: ServiceArgs, tmp_dir: Path | None = None):
    """CoordinatorSettings exactly as the container would load them (flags, env, --config file)."""
    import tempfile

    from mindmotor.coordinator.cli import settings_from_args

    argv = [map_image_paths(a) for a in service.argv]
    env = {k: map_image_paths(v) for k, v in service.env.items()}
    args = parse_cli(argv, env)
    with tempfile.TemporaryDirectory() as tmp:
        if args.config is not None:
            if args.config not in CONFIG_FILES:
                raise AssertionError(f"{service.where}: --config {args.config} is not mounted from a ConfigMap")
            path = Path(tmp) / "config.yaml"
            path.write_text(map_image_paths(CONFIG_FILES[args.config]))
            args.config = str(path)
        _stand_in_secret_files(args, Path(tmp), service.where)
        with environment(env):
            return settings_from_args(args)


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


# ---- docker-compose.yml -------------------------------------------------------------------------

def compose() -> dict:
    return load_yaml(COMPOSE_FILE)


def compose_env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def is_mindmotor_image(image: str | None) -> bool:
    return bool(image) and image.split("/")[-1].split(":")[0] == IMAGE


def compose_services() -> list[ServiceArgs]:
    out = []
    for name, svc in compose()["services"].items():
        if not is_mindmotor_image(svc.get("image")):
            continue
        argv = _as_argv(svc.get("command"), f"compose:{name}")
        env = compose_env(svc)
        out.append(ServiceArgs(f"compose:{name}", name, argv, env, parse_cli(argv, env)))
    return out


def _as_argv(command, where: str) -> list[str]:
    if isinstance(command, str):
        raise AssertionError(f"{where}: give the command as a list, not a shell string")
    if not command:
        raise AssertionError(f"{where}: no command (the image's CMD is only --help)")
    return [str(c) for c in command]


# ---- Kubernetes ---------------------------------------------------------------------------------

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job")
DOWNWARD_SAMPLES = {"status.podIP": "198.51.100.7", "metadata.name": "pod-0", "spec.nodeName": "node-0",
                    "metadata.namespace": NAMESPACE, "status.hostIP": "198.51.100.1"}


def k8s_files() -> list[Path]:
    return sorted(p for p in K8S_DIR.glob("*.yaml") if p.name != "kustomization.yaml")


def k8s_docs() -> list[tuple[Path, dict]]:
    docs = [(path, doc) for path in k8s_files() for doc in load_yaml_all(path)]
    CONFIG_FILES.clear()
    CONFIG_FILES.update(configmap_mounts(docs))
    SECRET_MOUNTS.clear()
    SECRET_MOUNTS.update(secret_mounts(docs))
    return docs


def workloads(docs) -> list[tuple[Path, dict]]:
    return [(p, d) for p, d in docs if d.get("kind") in WORKLOAD_KINDS]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def configmap_mounts(docs) -> dict[str, str]:
    """Container path -> file text for every ConfigMap key mounted into a container."""
    maps = {d["metadata"]["name"]: d.get("data") or {} for _, d in docs if d.get("kind") == "ConfigMap"}
    out = {}
    for _, w in workloads(docs):
        spec = pod_spec(w)
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        for c in spec["containers"]:
            for m in c.get("volumeMounts") or []:
                cm = volumes.get(m["name"], {}).get("configMap")
                if cm and cm["name"] in maps:
                    for key, text in maps[cm["name"]].items():
                        out[f"{m['mountPath'].rstrip('/')}/{key}"] = text
    return out


def secret_mounts(docs) -> dict[str, str]:
    """Container directory -> Secret name for every Secret volume mounted into a container."""
    out = {}
    for _, w in workloads(docs):
        spec = pod_spec(w)
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        for c in spec["containers"]:
            for m in c.get("volumeMounts") or []:
                secret = volumes.get(m["name"], {}).get("secret")
                if secret:
                    out[m["mountPath"]] = secret["secretName"]
    return out


def container_env(container: dict) -> dict[str, str]:
    """The container's environment with downward-API values replaced by samples and secrets by a
    placeholder (what matters here is which variables exist)."""
    env = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
        else:
            source = item.get("valueFrom") or {}
            if "fieldRef" in source:
                env[item["name"]] = DOWNWARD_SAMPLES[source["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in source or "configMapKeyRef" in source:
                env[item["name"]] = "from-a-secret"
            else:
                raise AssertionError(f"env {item['name']}: unsupported valueFrom {source}")
    return env


def expand_k8s_vars(text: str, env: dict[str, str], where: str) -> str:
    """Kubernetes' $(VAR) expansion in command/args; an undefined variable is an error here (the
    kubelet would pass the text through verbatim)."""
    def sub(m: re.Match) -> str:
        if m.group(1) not in env:
            raise AssertionError(f"{where}: $({m.group(1)}) is not defined in the container's env")
        return env[m.group(1)]
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, text)


def k8s_services(docs=None) -> list[tuple[dict, dict, ServiceArgs]]:
    """(workload, container, parsed args) for every container running the mindmotor image."""
    docs = docs if docs is not None else k8s_docs()
    out = []
    for path, w in workloads(docs):
        for c in pod_spec(w)["containers"]:
            if not is_mindmotor_image(c.get("image")):
                continue
            where = f"kubernetes:{path.name}/{w['metadata']['name']}/{c['name']}"
            command = list(c.get("command") or [])
            if command and command[:1] != ["mindmotor"]:
                raise AssertionError(f"{where}: command {command} does not run mindmotor")
            raw = [str(a) for a in command[1:] + list(c.get("args") or [])]
            env = container_env(c)
            argv = [expand_k8s_vars(a, env, where) for a in raw]
            mm_env = {k: v for k, v in env.items() if k.startswith("MINDMOTOR_")}
            out.append((w, c, ServiceArgs(where, w["metadata"]["name"], argv, mm_env, parse_cli(argv, mm_env))))
    return out


def container_ports(container: dict) -> dict[str, int]:
    """name (or str(number)) -> containerPort."""
    out = {}
    for p in container.get("ports") or []:
        out[str(p["containerPort"])] = p["containerPort"]
        if "name" in p:
            out[p["name"]] = p["containerPort"]
    return out


def resolve_port(port, container: dict) -> int | None:
    return container_ports(container).get(str(port))


# ---- the metrics the services register -----------------------------------------------------------

@dataclass(frozen=True)
class Family:
    name: str                  # as registered (counters without _total)
    type: str                  # counter | gauge | histogram | summary | info | unknown
    labels: frozenset[str]
    service: str

    def sample_names(self) -> set[str]:
        n = self.name
        return {"counter": {f"{n}_total", f"{n}_created"},
                "gauge": {n},
                "histogram": {f"{n}_bucket", f"{n}_sum", f"{n}_count", f"{n}_created"},
                "summary": {n, f"{n}_sum", f"{n}_count", f"{n}_created"},
                "info": {f"{n}_info"}}.get(self.type, {n})

    def labels_of(self, sample: str) -> set[str]:
        own = set(self.labels) | ({"le"} if sample.endswith("_bucket") else set()) | \
            ({"quantile"} if self.type == "summary" and sample == self.name else set())
        # a metric label that collides with a target label is renamed by Prometheus
        return {f"exported_{l}" if l in TARGET_LABELS else l for l in own} | TARGET_LABELS


class _Zero:
    """Stands in for the engine's stats: every figure 0 (the collector only reads them)."""

    def __getattr__(self, name: str):
        if name == "lora":                 # an engine serving LoRA adapters: its families are registered too
            return {"running_lora_adapters": [], "waiting_lora_adapters": [], "max_lora": 4, "loads": 0,
                    "load_s": 0.0, "requests": {"sql": 0}}
        if name == "iteration_tokens":
            from mindmotor.common.vllm_metrics import BucketCounts
            return BucketCounts()
        return 0


class _FakeEngine:
    info = _Zero()

    def stats(self):
        return _Zero()

    def device_snapshot(self) -> dict:
        return {"device": "910B3-0"}


def _wrapped(obj, service: str) -> list[Family]:
    from prometheus_client.metrics import MetricWrapperBase

    out = []
    values = list(vars(obj).values())
    values += [v for d in values if isinstance(d, dict) for v in d.values()]     # families kept by name
    for value in values:
        if isinstance(value, MetricWrapperBase):
            out.append(Family(value._name, value._type, frozenset(value._labelnames), service))
    return out


def _collected(registry, service: str, skip: set[str]) -> list[Family]:
    out = []
    for fam in registry.collect():
        if fam.name in skip:
            continue
        labels = frozenset(l for s in fam.samples for l in s.labels if l not in ("le", "quantile"))
        out.append(Family(fam.name, fam.type, labels, service))
    return out


def registered_metrics() -> dict[str, Family]:
    """Every metric family the coordinator, controller, workers, deployer and trainer register, by name;
    built from the services' own metric classes (a worker's scrape-time collector is run against
    a stand-in engine)."""
    from mindmotor.controller.metrics import ControllerMetrics
    from mindmotor.coordinator.metrics import CoordinatorMetrics
    from mindmotor.worker.metrics import WorkerMetrics

    families: list[Family] = []
    coordinator = CoordinatorMetrics()
    families += _wrapped(coordinator, "coordinator")
    controller = ControllerMetrics("test")
    families += _wrapped(controller, "controller")
    worker = WorkerMetrics(_FakeEngine(), SimpleNamespace(in_flight={}, accepting=True))
    wrapped = _wrapped(worker, "worker")
    families += wrapped
    families += _collected(worker.registry, "worker", {f.name for f in wrapped})
    from mindmotor.deployer.metrics import DeployerMetrics
    families += _wrapped(DeployerMetrics(), "deployer")
    from mindmotor.trainer import metrics as trainer_metrics
    families += _wrapped(SimpleNamespace(**{k: v for k, v in vars(trainer_metrics).items()}), "trainer")
    by_name: dict[str, Family] = {}
    for f in families:
        by_name.setdefault(f.name, f)
    return by_name


def sample_index(families: dict[str, Family]) -> dict[str, Family]:
    """Every series name Prometheus would store -> its family."""
    return {sample: f for f in families.values() for sample in f.sample_names()}


# ---- PromQL --------------------------------------------------------------------------------------

PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                   "unless", "offset", "inf", "nan", "atan2"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)?\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_IDENT = re.compile(r"(?<![\w.$:])([A-Za-z_:][A-Za-z0-9_:]*)\b(?!\s*\()")
_GRAFANA_VAR = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*(?::[a-z]+)?\}?")


@dataclass
class Query:
    metrics: set[str]                       # series names the expression reads
    matchers: list[tuple[str, str]]         # (series name or "", label) in {...}
    grouping: set[str]                      # labels in by/without/on/ignoring/group_*(...)


def parse_promql(expr: str) -> Query:
    """The series names and label names a PromQL expression uses (enough PromQL for checking
    names: strings, ranges, selectors, grouping clauses, function calls)."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\[[^\]]*\]", "", text)                  # range / subquery durations
    text = _GRAFANA_VAR.sub("1", text)
    matchers = []
    for m in _SELECTOR.finditer(text):
        for label in _MATCHER.findall(m.group(2)):
            matchers.append((m.group(1) or "", label))
    text = _SELECTOR.sub(lambda m: f" {m.group(1) or ''} ", text)
    grouping = set()
    for m in _GROUPING.finditer(text):
        grouping |= {l.strip() for l in m.group(2).split(",") if l.strip()}
    text = _GROUPING.sub(" ", text)
    text = re.sub(r"\b\d+(?:\.\d+)?(?:e[+-]?\d+)?[smhdwy]?\b", " ", text)   # numbers and durations
    metrics = {m for m in _IDENT.findall(text) if m.lower() not in PROMQL_KEYWORDS}
    return Query(metrics, matchers, grouping)


def label_values_query(query: str) -> tuple[str, str] | None:
    """Grafana's `label_values(metric, label)` -> (metric, label)."""
    m = re.fullmatch(r"\s*label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{[^}]*\})?\s*,\s*(\w+)\s*\)\s*", query)
    return (m.group(1), m.group(2)) if m else None


def legend_labels(legend: str) -> set[str]:
    return set(re.findall(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", legend or ""))


def alert_rules() -> list[dict]:
    return [r for g in load_yaml(ALERTS)["groups"] for r in g["rules"]]


def dashboard_panels(dashboard: dict) -> Iterator[dict]:
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])     # collapsed rows


def dashboard_queries(dashboard: dict) -> Iterator[tuple[str, str, str]]:
    """(where, expr, legendFormat) for every panel target."""
    for panel in dashboard_panels(dashboard):
        for t in panel.get("targets") or []:
            if "expr" in t:
                yield f"panel {panel.get('title')!r} target {t.get('refId')}", t["expr"], t.get("legendFormat", "")


def load_dashboard(path: Path) -> dict:
    return json.loads(path.read_text())
