"""`mindmotor operator` end to end: the real process (kopf's own client, the backend's KubeHTTPAPI)
against `FakeKubeServer` over HTTP — a fake, because no Kubernetes API server can run where the
suite runs (tests/support/fake_kube_server.py says what it does and does not do) — and a real
controller, which receives the traffic weights. The test plays kubectl (create, scale, patch,
delete: HTTP calls like kubectl's) and the kubelet (it sets a Deployment's `readyReplicas`).

One InferenceService: created (2 replicas), scaled to 4 (the scale subresource), given a canary (no traffic until its
replica is ready, then 20%), rolled back, given another canary and promoted, deleted (the
finalizer's handler removes every object and the controller's traffic entry first)."""

from __future__ import annotations

import grpc
import httpx
import pytest

from fake_kube_server import FakeKubeServer
from mindmotor.common import rpc
from mindmotor.common.ports import free_port
from mindmotor.common.waiting import wait_until
from mindmotor.operator.cli import READY_PREFIX
from mindmotor.protocol import controller_pb2, controller_pb2_grpc
from mindmotor.runtime.child_process import ChildProcess
from service_processes import FAST_CONTROLLER, ControllerProcess

from .test_resource import CRD, docs

NS = "serving"
IS_PATH = f"/apis/serving.mindmotor.io/v1/namespaces/{NS}/inferenceservices"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
MERGE = {"Content-Type": "application/merge-patch+json"}
WAIT_S = 10.0


@pytest.fixture
def kube():
    server = FakeKubeServer([CRD]).start()
    yield server
    server.stop()


def controller_traffic(address: str) -> dict[str, tuple[str, dict[str, float]]]:
    """deployment -> (model, weights) in the controller's routing table (the first table of a Watch)."""
    with rpc.channel(address) as channel:
        call = controller_pb2_grpc.ControllerStub(channel).Watch(controller_pb2.WatchRequest(), timeout=5)
        try:
            table = next(call)
        finally:
            call.cancel()
    return {t.deployment: (t.model, dict(t.weights)) for t in table.traffic}


TEST_AGENT = "kubectl-in-the-test"


def rbac_request(method: str, path: str, watch: bool) -> tuple[str, str, str, str]:
    """(apiGroup, resource[/subresource], verb, namespace) of one API request, as RBAC sees it."""
    parts = [p for p in path.split("/") if p]
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespace = ""
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method)
    if verb is None:
        verb = "watch" if watch else ("get" if len(rest) > 1 else "list")
    return group, resource, verb, namespace


def allowed_by_role(requests, role: dict) -> list[tuple]:
    """The requests the Role's rules do not allow (discovery — /version, /api/v1, /apis/GROUP/VERSION —
    aside: it is open to every authenticated client)."""
    refused = []
    for method, path, watch, _ in requests:
        parts = path.strip("/").split("/")
        if len(parts) <= {"version": 1, "api": 2, "apis": 3}.get(parts[0], 0):
            continue
        group, resource, verb, namespace = rbac_request(method, path, watch)
        ok = namespace == role["metadata"]["namespace"] and any(
            group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]
            for rule in role["rules"])
        if not ok:
            refused.append((method, path, verb))
    return refused


class Kubectl:
    def __init__(self, server: FakeKubeServer):
        self.server = server
        self.http = httpx.Client(base_url=server.url, timeout=5, headers={"User-Agent": TEST_AGENT})

    def checked(self, response: httpx.Response) -> dict:
        assert response.status_code < 400, response.text
        return response.json()

    def create(self, body: dict) -> dict:
        return self.checked(self.http.post(IS_PATH, json=body))

    def patch(self, name: str, spec: dict) -> dict:
        return self.checked(self.http.patch(f"{IS_PATH}/{name}", json={"spec": spec}, headers=MERGE))

    def scale(self, name: str, replicas: int) -> dict:
        """`kubectl scale inferenceservice NAME --replicas N`: a merge patch of the scale subresource."""
        return self.checked(self.http.patch(f"{IS_PATH}/{name}/scale", json={"spec": {"replicas": replicas}},
                                            headers=MERGE))

    def delete(self, name: str) -> None:
        self.checked(self.http.delete(f"{IS_PATH}/{name}"))

    def get(self, name: str) -> dict | None:
        response = self.http.get(f"{IS_PATH}/{name}")
        return None if response.status_code == 404 else self.checked(response)

    def deployments(self) -> dict[str, int]:
        return {name: o["spec"]["replicas"] for name, o in self.server.snapshot("deployments").items()}

    def services(self) -> set[str]:
        return set(self.server.snapshot("services"))

    def set_ready(self, deployment: str, ready: int) -> None:
        """What the kubelet and the Deployment controller would report."""
        self.checked(self.http.patch(f"{DEPLOYMENTS}/{deployment}/status", json={"status": {"readyReplicas": ready}},
                                     headers=MERGE))

    def condition(self, name: str, kind: str) -> tuple[str, str] | None:
        obj = self.get(name) or {}
        found = [c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind]
        return (found[0]["status"], found[0]["reason"]) if found else None

    def status(self, name: str) -> dict:
        return (self.get(name) or {}).get("status") or {}


def inference_service(name: str, replicas: int) -> dict:
    return {"apiVersion": "serving.mindmotor.io/v1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"model": "demo-model", "version": "v1", "replicas": replicas,
                     "runtime": {"device": "910B3", "emulate": "qwen2-7b", "timing": "virtual"},
                     "resources": {"cpu": "1", "memory": "2Gi", "npu": 8},
                     "roles": {"prefill": 1, "decode": 1}}}


def test_the_operator_creates_scales_canaries_rolls_back_promotes_and_deletes(kube, tmp_path):
    """Plus: an invalid spec is reported in its status, and nothing of it is applied."""
    port = free_port()                                      # the two start at once: the port is known
    controller = ControllerProcess(tmp_path / "controller.log", port=port, flags=FAST_CONTROLLER)
    operator = ChildProcess("operator", [
        "operator", "--namespace", NS, "--k8s-api-server", kube.url, "--image", "mindmotor:test",
        "--worker-controller", f"127.0.0.1:{port}", "--controller", f"127.0.0.1:{port}",
        "--resync-interval", "0.2", "--log-level", "DEBUG"], READY_PREFIX, tmp_path / "operator.log")
    kubectl = Kubectl(kube)
    try:
        controller.wait_ready()
        operator.wait_ready(30)

        # create: 2 replicas, one prefill and one decode Deployment
        created = kubectl.create(inference_service("demo", 2))
        wait_until(lambda: kubectl.deployments() == {"demo-v1-prefill": 1, "demo-v1-decode": 1}
                   and kubectl.services() == {"demo-v1"}, WAIT_S, what="the serving version's Deployments and Service")
        worker = kube.snapshot("deployments")["demo-v1-prefill"]
        owner = worker["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("InferenceService", "demo", created["metadata"]["uid"])
        assert worker["spec"]["template"]["metadata"]["annotations"]["serving.mindmotor.io/npu"] == "8"
        args = worker["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--tp") + 1] == "8" and args[args.index("--controller") + 1] == controller.address
        assert "serving.mindmotor.io/operator" in kubectl.get("demo")["metadata"]["finalizers"]
        wait_until(lambda: kubectl.condition("demo", "Ready") == ("False", "ReplicasNotReady"), WAIT_S)
        kubectl.set_ready("demo-v1-prefill", 1)
        kubectl.set_ready("demo-v1-decode", 1)
        wait_until(lambda: kubectl.condition("demo", "Ready") == ("True", "AllReplicasReady"), WAIT_S, what="Ready")
        wait_until(lambda: controller_traffic(controller.address).get("demo") == ("demo-model", {"v1": 100.0}),
                   WAIT_S, what="the weights at the controller")

        # scale to 4 (`kubectl scale`): the two new replicas are mixed
        assert kubectl.scale("demo", 4)["spec"]["replicas"] == 4
        wait_until(lambda: kubectl.deployments() == {"demo-v1-prefill": 1, "demo-v1-decode": 1, "demo-v1": 2},
                   WAIT_S, what="4 replicas")
        wait_until(lambda: kubectl.condition("demo", "Ready") == ("False", "ReplicasNotReady"), WAIT_S)
        kubectl.set_ready("demo-v1", 2)
        wait_until(lambda: kubectl.status("demo").get("readyReplicas") == 4
                   and kubectl.condition("demo", "Ready") == ("True", "AllReplicasReady"), WAIT_S, what="4 ready")
        scale = kubectl.checked(kubectl.http.get(f"{IS_PATH}/demo/scale"))       # what an HPA reads
        assert scale["status"] == {"replicas": 4, "selector": "app.kubernetes.io/managed-by=mindmotor-operator,"
                                                              "mindmotor.io/deployment=demo,mindmotor.io/version=v1"}

        # canary: no traffic until its replica is ready, then 20%
        kubectl.patch("demo", {"canary": {"version": "v2", "replicas": 1, "traffic": 20}})
        wait_until(lambda: kubectl.deployments().get("demo-v2") == 1, WAIT_S, what="the canary's Deployment")
        wait_until(lambda: kubectl.condition("demo", "Canary") == ("True", "CanaryStarting")
                   and kubectl.status("demo")["traffic"] == {"v1": 100.0, "v2": 0.0}, WAIT_S, what="no canary traffic")
        kubectl.set_ready("demo-v2", 1)
        wait_until(lambda: kubectl.condition("demo", "Canary") == ("True", "CanaryServing"), WAIT_S)
        wait_until(lambda: controller_traffic(controller.address)["demo"] == ("demo-model", {"v1": 80.0, "v2": 20.0}),
                   WAIT_S, what="the canary's share at the controller")
        wait_until(lambda: kubectl.condition("demo", "TrafficRouted") == ("True", "WeightsAtController"), WAIT_S)

        # roll back: the canary goes, v1 takes everything again
        kubectl.patch("demo", {"canary": None})
        wait_until(lambda: "demo-v2" not in kubectl.deployments() and "demo-v2" not in kubectl.services(), WAIT_S,
                   what="the canary removed")
        wait_until(lambda: kubectl.condition("demo", "Canary") == ("False", "RolledBack")
                   and kubectl.status("demo")["traffic"] == {"v1": 100.0}, WAIT_S, what="rolled back")
        assert controller_traffic(controller.address)["demo"] == ("demo-model", {"v1": 100.0})

        # promote another canary: v3 becomes the serving version, v1 goes once v3 is ready
        kubectl.patch("demo", {"canary": {"version": "v3", "replicas": 4, "traffic": 50}})
        wait_until(lambda: kubectl.deployments().get("demo-v3") == 2, WAIT_S, what="v3's Deployments")
        for name, ready in (("demo-v3-prefill", 1), ("demo-v3-decode", 1), ("demo-v3", 2)):
            kubectl.set_ready(name, ready)
        wait_until(lambda: kubectl.condition("demo", "Canary") == ("True", "CanaryServing"), WAIT_S)
        kubectl.patch("demo", {"version": "v3", "canary": None})
        wait_until(lambda: kubectl.deployments() == {"demo-v3-prefill": 1, "demo-v3-decode": 1, "demo-v3": 2},
                   WAIT_S, what="v1 removed")
        wait_until(lambda: kubectl.condition("demo", "Canary") == ("False", "Promoted"), WAIT_S)
        wait_until(lambda: controller_traffic(controller.address)["demo"] == ("demo-model", {"v3": 100.0}), WAIT_S)

        # an invalid spec (the API server's CEL rules are not in the fake: the operator's own checks
        # catch it) is reported in the status, and nothing is applied
        kubectl.create(inference_service("bad", 1))           # prefill 1 + decode 1 > 1 replica
        wait_until(lambda: (kubectl.condition("bad", "Ready") or ("",))[0] == "False", WAIT_S, what="a condition")
        (ready,) = [c for c in kubectl.status("bad")["conditions"] if c["type"] == "Ready"]
        assert ready["reason"] == "InvalidSpec" and "exceed replicas" in ready["message"], ready
        assert not [name for name in kubectl.deployments() if name.startswith("bad-")]

        # delete: the finalizer holds the object until every version and the traffic entry are gone
        kubectl.delete("demo")
        kubectl.delete("bad")
        wait_until(lambda: kubectl.get("demo") is None and kubectl.get("bad") is None, WAIT_S,
                   what="the InferenceServices gone")
        assert kubectl.deployments() == {} and kubectl.services() == set()
        wait_until(lambda: "demo" not in controller_traffic(controller.address), WAIT_S, what="the traffic entry gone")

        # every call the operator made is one its Role in deploy/kubernetes/operator allows
        role = [d for d in docs("operator.yaml") if d["kind"] == "Role"][0]
        made = [r for r in kube.requests if r[3] != TEST_AGENT]
        assert {r[3].split("/")[0] for r in made} >= {"kopf", "python-httpx"}        # both clients were seen
        assert allowed_by_role([(m, p.replace(f"/namespaces/{NS}/", "/namespaces/mindmotor/"), w, a)
                                for m, p, w, a in made], role) == []
    except (AssertionError, TimeoutError, grpc.RpcError):
        print(operator.log_tail(60))
        raise
    finally:
        kubectl.http.close()
        operator.stop(timeout_s=10)
        controller.kill()
    assert operator.proc.returncode == 0, operator.log_tail(20)

