"""How quickly `mindmotor operator` (kopf) acts on an InferenceService, and what it costs to run.

Starts the fake Kubernetes API server the tests use (tests/support/fake_kube_server.py: real HTTP,
no cluster — none can run here) and `mindmotor operator` against it, then times, from the client's
request to the result seen through the API:

    start_s        process start -> MINDMOTOR_OPERATOR_READY (imports, kopf's discovery, the first list)
    create_s       POST of an InferenceService -> its Deployments and Service applied (the finalizer
                   is added first: two round trips through the watch)
    scale_p50_s    median of `--scales` replica changes (merge patch of spec.replicas) -> the
    scale_max_s    Deployment at the new count; and the slowest
    delete_s       DELETE -> the object gone (finalizer handler: Deployments removed, finalizer dropped)
    stop_s         SIGTERM -> exit
    rss_mib        the operator's resident memory after all that
    kopf_import_s  `import kopf` alone, in a fresh interpreter

    PYTHONPATH=services python benchmarks/operator_latency.py [--scales 20] [--resync 5]

The last line is JSON with exactly those keys.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from fake_kube_server import FakeKubeServer  # noqa: E402

from mindmotor.operator.cli import READY_PREFIX  # noqa: E402
from mindmotor.runtime.child_process import ChildProcess  # noqa: E402

NS = "bench"
IS_PATH = f"/apis/serving.mindmotor.io/v1/namespaces/{NS}/inferenceservices"
MERGE = {"Content-Type": "application/merge-patch+json"}


def until(predicate, timeout_s: float = 30.0) -> float:
    """Seconds until `predicate()` holds (polled every 2 ms)."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise TimeoutError("the operator did not act in time")
        time.sleep(0.002)
    return time.monotonic() - start


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scales", type=int, default=20)
    parser.add_argument("--resync", type=float, default=5.0, help="the operator's --resync-interval")
    parser.add_argument("--log", default="/tmp/mindmotor-operator-bench.log")
    args = parser.parse_args()

    crd = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "operator" / "crd.yaml").read_text())
    kube = FakeKubeServer([crd]).start()
    http = httpx.Client(base_url=kube.url, timeout=10)
    started = time.monotonic()
    operator = ChildProcess("operator", ["operator", "--namespace", NS, "--k8s-api-server", kube.url,
                                         "--resync-interval", str(args.resync)], READY_PREFIX, Path(args.log))
    try:
        operator.wait_ready(60)
        start_s = time.monotonic() - started

        def replicas() -> int | None:
            obj = kube.snapshot("deployments").get("bench-v1")
            return None if obj is None else obj["spec"]["replicas"]

        body = {"apiVersion": "serving.mindmotor.io/v1", "kind": "InferenceService",
                "metadata": {"name": "bench", "namespace": NS},
                "spec": {"model": "bench-model", "version": "v1", "replicas": 1}}
        sent = time.monotonic()
        http.post(IS_PATH, json=body).raise_for_status()
        until(lambda: replicas() == 1 and "bench-v1" in kube.snapshot("services"))
        create_s = time.monotonic() - sent

        scales = []
        for i in range(args.scales):
            count = 2 + i % 2
            sent = time.monotonic()
            http.patch(f"{IS_PATH}/bench", json={"spec": {"replicas": count}}, headers=MERGE).raise_for_status()
            until(lambda: replicas() == count)
            scales.append(time.monotonic() - sent)

        sent = time.monotonic()
        http.delete(f"{IS_PATH}/bench").raise_for_status()
        until(lambda: http.get(f"{IS_PATH}/bench").status_code == 404)
        delete_s = time.monotonic() - sent
        assert kube.snapshot("deployments") == {} and kube.snapshot("services") == {}
        memory = rss_mib(operator.proc.pid)
        sent = time.monotonic()
        operator.stop(30)
        stop_s = time.monotonic() - sent
    finally:
        operator.kill()
        http.close()
        kube.stop()
    import_s = float(subprocess.run([sys.executable, "-c", "import time; t = time.perf_counter(); import kopf; "
                                     "print(time.perf_counter() - t)"], capture_output=True, text=True,
                                    check=True).stdout)
    print(json.dumps({"start_s": round(start_s, 3), "create_s": round(create_s, 3),
                      "scale_p50_s": round(statistics.median(scales), 3), "scale_max_s": round(max(scales), 3),
                      "delete_s": round(delete_s, 3), "stop_s": round(stop_s, 3), "rss_mib": round(memory, 1),
                      "kopf_import_s": round(import_s, 3)}))


if __name__ == "__main__":
    main()
