#!/usr/bin/env python3
"""Run docker-compose.yml's services where there is no Docker: a manual end-to-end check.

    .venv/bin/python deploy/smoke/compose_without_docker.py      # as root: network namespaces
    (needs iproute2, util-linux's setpriv, curl, redis-server and Debian's `prometheus` package)

1. Builds an "image": a Python 3.11 venv made the way the Dockerfile makes the image (the
   serving dependencies from pyproject.toml's [project].dependencies, then `pip install --no-deps`
   of the build context, the bundled model linked as .../models/mindmotor-demo, the health-check
   script as `mindmotor-healthcheck`).
2. Gives every compose service its own network namespace on one bridge (its own IP, the same
   ports as in compose) and resolves service names through an /etc/hosts bind-mounted into each
   service's private mount namespace — containers by hand.
3. Starts redis, controller, worker-1, worker-2, coordinator with the exact `command` and
   `environment` of docker-compose.yml (the only changes: the image's /models is the venv's
   models/, the cluster-secret volume a directory with a fresh token), MindMotor services as uid 10001 like the image's USER, each waited on with its own
   compose healthcheck; then Prometheus with deploy/prometheus/prometheus.yml and alerts.yml.
4. From a client namespace, by service name: one /v1/completions request and a few chat
   requests, /health, the controller's /v1/instances; then Prometheus' targets (all must be up),
   its rules (all must load), and every expression of the Grafana dashboard (all must evaluate).
5. Stops everything (SIGTERM; workers drain) and deletes the namespaces, whatever happened.

Grafana is not run (no Debian package). Exit status 0 when every check passed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SUBNET = "10.213.77"          # addresses inside this script's own namespaces only
PREFIX = "mmsmoke"


class Smoke:
    def __init__(self, image: Path, run: Path, python: str):
        self.image, self.run, self.python = image, run, python
        self.compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
        self.names = [s for s in self.compose["services"] if s != "grafana"] + ["client"]
        self.ip = {name: f"{SUBNET}.{10 + i}" for i, name in enumerate(self.names)}
        self.procs: dict[str, subprocess.Popen] = {}
        self.failures: list[str] = []

    # ---- the "image" ---------------------------------------------------------------------------
    def build_image(self) -> None:
        venv = self.image / "venv"
        if (venv / "bin" / "mindmotor").exists():
            print(f"image venv: reusing {venv}")
            return
        print(f"image venv: building {venv} as the Dockerfile does", flush=True)
        subprocess.run([self.python, "-m", "venv", str(venv)], check=True)
        py = str(venv / "bin" / "python")
        context = self.image / "context"
        shutil.rmtree(context, ignore_errors=True)
        context.mkdir(parents=True)
        for f in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / f, context / f)
        shutil.copytree(ROOT / "services", context / "services",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        env = {**os.environ, "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        reqs = subprocess.run([py, "-c", "import tomllib; print('\\n'.join(tomllib.load(open('pyproject.toml', 'rb'))"
                                         "['project']['dependencies']))"],
                              cwd=context, check=True, capture_output=True, text=True).stdout
        (self.image / "requirements.txt").write_text(reqs)
        subprocess.run([py, "-m", "pip", "install", "-q", "-r", str(self.image / "requirements.txt")], check=True, env=env)
        subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "."], cwd=context, check=True, env=env)
        assets = subprocess.run([py, "-c", "import pathlib, mindmotor; print(pathlib.Path(mindmotor.__file__).parent"
                                           " / 'assets' / 'mindmotor-demo')"],
                                cwd="/", check=True, capture_output=True, text=True).stdout.strip()
        (self.image / "models").mkdir(exist_ok=True)
        (self.image / "models" / "mindmotor-demo").symlink_to(assets)
        check = venv / "bin" / "mindmotor-healthcheck"
        text = (ROOT / "deploy" / "docker" / "healthcheck.py").read_text().split("\n", 1)[1]
        check.write_text(f"#!{py}\n{text}")
        check.chmod(0o755)
        subprocess.run(["chmod", "-R", "a+rX", str(self.image)], check=True)
        torch = subprocess.run([py, "-m", "pip", "show", "torch"], capture_output=True).returncode == 0
        print(f"image venv: built; torch installed: {torch}")
        if torch:
            self.failures.append("torch is installed in the serving image")

    # ---- namespaces ----------------------------------------------------------------------------
    def ns(self, name: str) -> str:
        return f"{PREFIX}-{name}"

    def net_up(self) -> None:
        self.run.mkdir(parents=True, exist_ok=True)
        hosts = self.run / "hosts"
        hosts.write_text("127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in self.ip.items()))
        hosts.chmod(0o644)
        hub = self.ns("hub")
        sh("ip", "netns", "add", hub)
        sh("ip", "netns", "exec", hub, "ip", "link", "add", "br0", "type", "bridge")
        sh("ip", "netns", "exec", hub, "ip", "link", "set", "br0", "up")
        for i, name in enumerate(self.names):
            sh("ip", "netns", "add", self.ns(name))
            sh("ip", "link", "add", f"{PREFIX}{i}", "netns", hub, "type", "veth", "peer", "name", "eth0",
               "netns", self.ns(name))
            sh("ip", "netns", "exec", hub, "ip", "link", "set", f"{PREFIX}{i}", "master", "br0", "up")
            for cmd in (["ip", "addr", "add", f"{self.ip[name]}/24", "dev", "eth0"], ["ip", "link", "set", "eth0", "up"],
                        ["ip", "link", "set", "lo", "up"]):
                sh("ip", "netns", "exec", self.ns(name), *cmd)

    def net_down(self) -> None:
        for name in self.names + ["hub"]:
            sh("ip", "netns", "del", self.ns(name), check=False)

    def _script(self, argv: list[str], user: bool) -> str:
        drop = "setpriv --reuid 10001 --regid 10001 --clear-groups " if user else ""
        quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
        return f"mount --bind {self.run}/hosts /etc/hosts && cd /tmp && exec {drop}{quoted}"

    def env(self, extra: dict | None = None) -> dict:
        return {"PATH": f"{self.image}/venv/bin:/usr/bin:/bin", "HOME": "/tmp", **(extra or {})}

    def start(self, name: str, argv: list[str], user: bool = True, env: dict | None = None) -> None:
        log = open(self.run / f"{name}.log", "w")
        self.procs[name] = subprocess.Popen(["ip", "netns", "exec", self.ns(name), "sh", "-c", self._script(argv, user)],
                                            stdout=log, stderr=subprocess.STDOUT, env=self.env(env),
                                            start_new_session=True)

    def exec_in(self, name: str, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.ns(name), "sh", "-c", self._script(list(argv), False)],
                              capture_output=True, text=True, timeout=timeout, env=self.env())

    def get(self, url: str, *headers: str) -> dict:
        return json.loads(self.exec_in("client", "curl", "-sS", *[a for h in headers for a in ("-H", h)], url).stdout)

    def wait_healthy(self, name: str, timeout: float = 120) -> None:
        test = self.compose["services"][name]["healthcheck"]["test"]
        argv = test[1:] if test[0] == "CMD" else test
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited with {self.procs[name].returncode}; see {self.run}/{name}.log")
            if self.exec_in(name, *argv).returncode == 0:
                print(f"  {name}: healthy (its compose healthcheck passed)", flush=True)
                return
            time.sleep(1)
        raise RuntimeError(f"{name} was not healthy within {timeout} s; see {self.run}/{name}.log")

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + 45
        for name, p in self.procs.items():
            try:
                p.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            print(f"  {name}: exit {p.returncode}")
            if p.returncode != 0:
                self.failures.append(f"{name} exited with {p.returncode}")

    # ---- the run -------------------------------------------------------------------------------
    def check(self, ok: bool, what: str) -> None:
        print(f"  [{'ok' if ok else 'FAIL'}] {what}", flush=True)
        if not ok:
            self.failures.append(what)

    def services_up(self) -> None:
        self.start("redis", ["redis-server", "--bind", "0.0.0.0", "--port", "6379", "--save", "", "--appendonly", "no",
                             "--protected-mode", "no"], user=False)
        self.wait_healthy("redis")
        secrets_dir = self.run / "cluster-secret"          # what the cluster-secret service writes
        secrets_dir.mkdir(parents=True, exist_ok=True)
        token = secrets_dir / "cluster-token"
        token.write_text(__import__("secrets").token_urlsafe(32))
        os.chown(token, 10001, 10001)
        os.chmod(token, 0o400)
        for name in ("controller", "worker-1", "worker-2", "coordinator"):
            svc = self.compose["services"][name]
            argv = ["mindmotor", *[str(a).replace("/models/", f"{self.image}/models/") for a in svc["command"]]]
            env = {k: interpolate(str(v)).replace("/run/mindmotor/", f"{secrets_dir}/")
                   for k, v in (svc.get("environment") or {}).items()}
            print(f"{name}: {' '.join(argv)}", flush=True)
            self.start(name, argv, env=env)
            self.wait_healthy(name)
        prom = self.run / "prometheus"
        (prom / "data").mkdir(parents=True, exist_ok=True)
        for f in ("prometheus.yml", "alerts.yml"):
            shutil.copy2(ROOT / "deploy" / "prometheus" / f, prom / f)
        self.start("prometheus", ["prometheus", f"--config.file={prom}/prometheus.yml",
                                  f"--storage.tsdb.path={prom}/data", "--web.listen-address=0.0.0.0:9090"], user=False)

    def requests(self) -> None:
        print("requests from the client namespace, by service name:")
        body = json.dumps({"model": "mindmotor-demo", "prompt": "def fibonacci(n):", "max_tokens": 24, "temperature": 0})
        r = self.exec_in("client", "curl", "-sS", "-w", "\n%{http_code}", "http://coordinator:8000/v1/completions",
                         "-H", "Content-Type: application/json", "-H", api_key_header(), "-d", body)
        text, _, code = r.stdout.rpartition("\n")
        self.check(code == "200", f"POST coordinator:8000/v1/completions -> {code}: {text[:300]}")
        for i in range(6):
            self.exec_in("client", "curl", "-sS", "-o", "/dev/null", "http://coordinator:8000/v1/chat/completions",
                         "-H", "Content-Type: application/json", "-H", api_key_header(), "-d",
                         json.dumps({"model": "mindmotor-demo", "max_tokens": 16, "stream": i % 2 == 0,
                                     "messages": [{"role": "user", "content": f"import os {i}"}]}))
        health = self.get("http://coordinator:8000/health")
        self.check(sum(i["routable"] for i in health["instances"].values()) == 2, f"coordinator /health: {health}")
        instances = self.get("http://controller:8090/v1/instances",
                             f"Authorization: Bearer {os.environ['MINDMOTOR_ADMIN_TOKEN']}")["data"]
        self.check(sorted((i["address"], i["metrics_address"], i["state"]) for i in instances) ==
                   [("worker-1:50051", "worker-1:9100", "ready"), ("worker-2:50051", "worker-2:9100", "ready")],
                   f"controller /v1/instances: {[(i['instance_id'], i['address'], i['state']) for i in instances]}")

    def prometheus(self) -> None:
        print("Prometheus: waiting 20 s for scrapes and rule evaluations", flush=True)
        time.sleep(20)
        for t in self.get("http://prometheus:9090/api/v1/targets")["data"]["activeTargets"]:
            self.check(t["health"] == "up", f"target {t['labels']['job']} {t['scrapeUrl']} {t['health']} {t.get('lastError', '')}")
        rules = [r for g in self.get("http://prometheus:9090/api/v1/rules")["data"]["groups"] for r in g["rules"]]
        self.check(len(rules) > 0 and all(r.get("health") == "ok" for r in rules),
                   f"{len(rules)} alert rules loaded and evaluated; firing/pending: "
                   f"{[r['name'] for r in rules if r.get('state') != 'inactive']}")
        from tests.deploy import artifacts as A
        for path in A.DASHBOARDS:
            queries = list(A.dashboard_queries(A.load_dashboard(path)))
            errors, names = [], set()
            for where, expr, _ in queries:
                names |= A.parse_promql(expr).metrics
                e = expr.replace("$__rate_interval", "1m").replace("$model", ".*")
                r = self.get("http://prometheus:9090/api/v1/query?query=" + urllib.parse.quote(e))
                if r.get("status") != "success":
                    errors.append((where, r))
            self.check(not errors, f"{path.name}: {len(queries)} expressions evaluated, errors: {errors}")
            empty = sorted(n for n in names if not self.get("http://prometheus:9090/api/v1/query?query="
                                                             + urllib.parse.quote(f"count({n})"))["data"]["result"])
            print(f"  {path.name}: {len(names) - len(empty)}/{len(names)} series have data; none yet "
                  f"(labelled series appear with their first event): {empty}")
        pids = ",".join(str(p.pid) for p in self.procs.values())
        print(subprocess.run(["ps", "-o", "pid,user,rss,args", "-p", pids], capture_output=True, text=True).stdout)

    def main(self) -> int:
        self.build_image()
        try:
            self.net_up()
            self.services_up()
            self.requests()
            self.prometheus()
        except Exception as exc:   # noqa: BLE001 - report and tear down
            self.failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            print("stopping (SIGTERM; workers drain)", flush=True)
            self.stop_all()
            self.net_down()
        print("PASSED" if not self.failures else f"FAILED: {self.failures}")
        return 0 if not self.failures else 1


_COMPOSE_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([?-])([^}]*))?\}")


def interpolate(value: str) -> str:
    """Compose's `${VAR}`, `${VAR:-default}` and `${VAR:?message}` from this process's environment."""
    def sub(m: re.Match) -> str:
        name, kind, arg = m.groups()
        if os.environ.get(name):
            return os.environ[name]
        if kind == "?":
            raise SystemExit(f"docker-compose.yml needs ${name}: {arg}")
        return arg or ""
    return _COMPOSE_VAR.sub(sub, value)


def api_key_header() -> str:
    return f"Authorization: Bearer {os.environ['MINDMOTOR_API_KEYS'].split(',')[0]}"


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-dir", default="/tmp/mindmotor-smoke-image", help="the venv 'image' (reused if built)")
    parser.add_argument("--run-dir", default="/tmp/mindmotor-smoke-run", help="logs, hosts file, Prometheus data")
    parser.add_argument("--python", default="/usr/bin/python3.11", help="Python 3.11 for the image venv")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (network and mount namespaces)", file=sys.stderr)
        return 2
    # the secrets docker-compose.yml takes from the shell: the caller's, or fresh ones
    os.environ.setdefault("MINDMOTOR_ADMIN_TOKEN", secrets.token_hex(24))
    os.environ.setdefault("MINDMOTOR_API_KEYS", f"sk-{secrets.token_hex(16)}")
    return Smoke(Path(args.image_dir), Path(args.run_dir), args.python).main()


if __name__ == "__main__":
    sys.exit(main())
