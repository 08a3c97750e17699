"""The Dockerfile and its build context: base image, serving dependencies from pyproject (no
PyTorch), a non-root user, the `mindmotor` entrypoint, the bundled model as package data at the
path the compose file and manifests use; .dockerignore keeps what the build copies; the health
check script the compose file calls works."""

from __future__ import annotations

import fnmatch
import http.server
import json
import shutil
import subprocess
import sys
import threading
import tomllib
import zipfile
from pathlib import Path

import pytest

from . import artifacts as A

HEALTHCHECK = A.DEPLOY / "docker" / "healthcheck.py"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines, current = [], ""
    for raw in A.DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        current += " " + line.rstrip("\\").strip() if current else line.rstrip("\\").strip()
        if not line.endswith("\\"):
            op, _, rest = current.partition(" ")
            lines.append((op.upper(), rest.strip()))
            current = ""
    return lines


def test_dockerfile_shape():
    ins = instructions()
    assert ins[0] == ("FROM", "python:3.11-slim")
    assert [i for i in ins if i[0] == "FROM"] == [ins[0]]
    assert ("ENTRYPOINT", '["mindmotor"]') in ins
    users = [arg for op, arg in ins if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "runs as a non-root user"
    runs = " ".join(arg for op, arg in ins if op == "RUN")
    assert "torch" not in runs.lower() and "[train" not in runs, "serving image: no PyTorch"
    assert "['project']['dependencies']" in runs, "dependencies come from pyproject.toml"
    assert f"{A.IMAGE_MODEL_DIR}" in runs and "/models" in runs, "the bundled model's stable path is made"
    # the uid the manifests run as is the image's user
    assert users[-1].split(":")[0] == "10001"


def dockerignore_patterns() -> list[str]:
    return [l.strip() for l in A.DOCKERIGNORE.read_text().splitlines() if l.strip() and not l.startswith("#")]


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, enough for our patterns: a pattern matches the path or one of its parents;
    a later !pattern re-includes."""
    parts = path.split("/")
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        p = pattern.lstrip("!").rstrip("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if any(fnmatch.fnmatch(prefix, p) or (p.startswith("**/") and fnmatch.fnmatch(prefix.split("/")[-1], p[3:]))
               for prefix in prefixes):
            result = not negate
    return result


def copied_sources() -> list[str]:
    out = []
    for op, arg in instructions():
        if op == "COPY" and not arg.startswith("--from"):
            out += arg.split()[:-1]
    return [s.rstrip("/") for s in out]


def test_dockerignore_keeps_what_the_build_copies():
    patterns = dockerignore_patterns()
    sources = copied_sources()
    assert {"pyproject.toml", "README.md", "services"} <= set(sources)
    for source in sources:
        assert (A.ROOT / source).exists(), f"COPY {source}: no such file"
        assert not ignored(source, patterns), f".dockerignore drops {source}, which the Dockerfile copies"
    for path in ["services/mindmotor/assets/mindmotor-demo/model.safetensors",
                 "services/mindmotor/assets/mindmotor-demo/tokenizer.json"]:
        assert not ignored(path, patterns), path
    for path in [".venv/bin/python", ".git/HEAD", "services/mindmotor/__pycache__/cli.cpython-311.pyc",
                 "benchmarks/results/x.json", "loadtest/results/x.json", "tests/conftest.py"]:
        assert ignored(path, patterns), f".dockerignore should exclude {path}"


def test_pip_install_from_the_build_context_bundles_the_model(tmp_path):
    """What `pip install .` sees in the image (the files the Dockerfile copies, minus .dockerignore)
    builds a wheel with the demo model as package data and no PyTorch requirement."""
    context = tmp_path / "context"
    patterns = dockerignore_patterns()
    for source in copied_sources():
        src = A.ROOT / source
        if src.is_dir():
            shutil.copytree(src, context / source,
                            ignore=lambda d, names: [n for n in names
                                                     if ignored(str((Path(d) / n).relative_to(A.ROOT)), patterns)])
        else:
            (context / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, context / source)
    wheels = tmp_path / "wheels"
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                             "--no-index", "-q", "-w", str(wheels), str(context)],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]       # (needs setuptools, as `pip install -e .` does)
    (wheel,) = wheels.glob("mindmotor-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = next(z.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "mindmotor.json"]:
        assert f"mindmotor/assets/mindmotor-demo/{f}" in names
    requires = [l for l in metadata.splitlines() if l.startswith("Requires-Dist:")]
    unconditional = [r for r in requires if "extra ==" not in r]
    assert not any("torch" in r for r in unconditional), unconditional
    serving = tomllib.loads((A.ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert len(unconditional) == len(serving)


# ---- the health check script ----------------------------------------------------------------------

def run_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HEALTHCHECK), *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def grpc_health():
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port, servicer, health_pb2
    server.stop(0)


def test_healthcheck_grpc(grpc_health):
    port, servicer, health_pb2 = grpc_health
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert run_check("grpc", f"127.0.0.1:{port}").returncode == 0
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)        # a draining worker
    result = run_check("grpc", f"127.0.0.1:{port}")
    assert result.returncode == 1 and "NOT_SERVING" in result.stderr
    assert run_check("grpc", f"127.0.0.1:{port}", "mindmotor.v1.Unknown").returncode == 1


def test_healthcheck_http():
    status = {"code": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status["code"])
            self.end_headers()
            self.wfile.write(json.dumps({"ready": status["code"] == 200}).encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/ready"
        assert run_check("http", url).returncode == 0
        status["code"] = 503
        result = run_check("http", url)
        assert result.returncode == 1 and "503" in result.stderr
    finally:
        server.shutdown()
        server.server_close()
    assert run_check("nonsense").returncode == 2


def test_every_artifact_parses():
    for path in [A.COMPOSE_FILE, A.PROMETHEUS_COMPOSE, A.PROMETHEUS_K8S, A.ALERTS,
                 *sorted((A.GRAFANA / "provisioning").rglob("*.yml")), *sorted(A.K8S_DIR.glob("*.yaml"))]:
        assert A.load_yaml_all(path), path
    for path in A.DASHBOARDS:
        dashboard = A.load_dashboard(path)
        assert dashboard["uid"] and dashboard["title"] and dashboard["panels"]
        ids = [p["id"] for p in A.dashboard_panels(dashboard)]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"


def test_smoke_script_compiles():
    """deploy/smoke/compose_without_docker.py (run by hand, as root) at least stays valid Python."""
    path = A.DEPLOY / "smoke" / "compose_without_docker.py"
    compile(path.read_text(), str(path), "exec")
