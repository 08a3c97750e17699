"""The kubernetes backend. No cluster runs here, so: the manifests are checked for what an API
server and the worker's own command line would refuse; the backend is driven through the reconcile
loop against an in-memory fake of the API (fake_kube.py); the real HTTP client's requests are
checked with a mock transport. None of this proves it against a real cluster."""

from __future__ import annotations

import json

import httpx
import kubernetes_validate
import pytest

from mindmotor.cli import build_parser
from mindmotor.common.store import MemoryStore
from mindmotor.deployer.backends.base import VersionTarget
from mindmotor.deployer.backends.kube_api import KubeAPIError, KubeHTTPAPI
from mindmotor.deployer.backends.kubernetes import KubernetesBackend
from mindmotor.deployer.backends.manifests import render_version
from mindmotor.deployer.metrics import DeployerMetrics
from mindmotor.deployer.operations import Deployments
from mindmotor.deployer.reconcile import Reconciler
from mindmotor.deployer.spec import parse_spec
from mindmotor.deployer.store import DeploymentStore
from mindmotor.worker.cli import config_from_args

from .doubles import Clock, ControllerView
from fake_kube import InMemoryKubeAPI, check_object

NS = "serving"


def spec(checkpoint: str, **version):
    return parse_spec({"name": "demo", "model": "qwen", "versions": [{
        "name": "v1", "checkpoint": checkpoint, "replicas": 4, "prefill": 1, "decode": 1,
        "worker": {"emulate": "qwen2-7b", "drain_timeout": 20}, "resources": {"cpu": "2", "memory": "8Gi"},
        **version}]})


def test_manifests_of_a_version_with_roles():
    s = spec("/checkpoints/qwen-step800")
    objects = render_version(VersionTarget(s, s.versions[0]), 4, NS, "registry/mindmotor:1.0", "controller:50050",
                             checkpoint_claim="ckpts")
    for obj in objects:
        check_object(obj)
        kubernetes_validate.validate(obj, "1.31.0", strict=True)      # the API's own schemas, offline
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("Deployment", "demo-v1-prefill"), ("Deployment", "demo-v1-decode"), ("Deployment", "demo-v1"),
        ("Service", "demo-v1")]
    assert [o["spec"]["replicas"] for o in objects[:3]] == [1, 1, 2]

    pod = objects[0]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["terminationGracePeriodSeconds"] == 30                      # the drain timeout + 10 s
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"},
                                      "limits": {"cpu": "2", "memory": "8Gi"}}
    assert pod["volumes"][0]["persistentVolumeClaim"] == {"claimName": "ckpts", "readOnly": True}
    assert container["readinessProbe"]["grpc"] == {"port": 50051}
    assert {e["name"] for e in container["env"]} == {"POD_NAME", "POD_IP", "NODE_NAME", "MINDMOTOR_CLUSTER_TOKEN"}

    args = build_parser().parse_args(container["args"])                   # the real `mindmotor` parser
    config = config_from_args(args)
    assert (config.controller, config.served_model_name, config.deployment, config.version, config.role) == \
        ("controller:50050", "qwen", "demo", "v1", "prefill")
    assert (config.worker_id, config.advertise_address, config.node) == ("$(POD_NAME)", "$(POD_IP):50051", "$(NODE_NAME)")
    assert (config.engine.model, config.engine.emulate, config.drain_timeout_s, config.port) == \
        ("/checkpoints/qwen-step800", "qwen2-7b", 20.0, 50051)
    service = objects[3]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"app.kubernetes.io/managed-by": "mindmotor-deployer",
                                           "mindmotor.io/deployment": "demo", "mindmotor.io/version": "v1"}


@pytest.mark.asyncio
async def test_the_backend_through_the_reconcile_loop(tiny_ckpt):
    api, view, clock = InMemoryKubeAPI(), ControllerView(), Clock()
    backend = KubernetesBackend(api, NS, "mindmotor:test", "controller:50050")
    store = DeploymentStore(MemoryStore())
    reconciler = Reconciler(store, backend, view, DeployerMetrics(), clock=clock)
    ops = Deployments(store, rollout_timeout_s=60, clock=clock)

    await ops.apply(spec(str(tiny_ckpt), prefill=0, decode=0, replicas=2))
    await reconciler.reconcile_once()
    assert api.deployments() == {"demo-v1": 2} and ("Service", NS, "demo-v1") in api.objects
    await reconciler.reconcile_once()
    assert api.calls.count(("apply", "Deployment", "demo-v1")) == 1       # idempotent
    api.set_ready(NS, "demo-v1", 1)
    await reconciler.reconcile_once()
    assert (reconciler.status["demo"][0].running, reconciler.status["demo"][0].desired) == (2, 2)

    await ops.rollout("demo", "v2", str(tiny_ckpt), canary=10)
    await reconciler.reconcile_once()
    assert api.deployments() == {"demo-v1": 2, "demo-v2": 2}
    view.ready_counts[("demo", "v2")] = 2
    await reconciler.reconcile_once()
    await ops.promote("demo")
    await reconciler.reconcile_once()
    assert api.deployments() == {"demo-v2": 2} and ("Service", NS, "demo-v1") not in api.objects
    assert view.table["demo"] == ("qwen", {"v2": 1.0})

    await ops.delete("demo")
    await reconciler.reconcile_once()
    await reconciler.reconcile_once()
    assert api.objects == {} and await ops.list() == []


@pytest.mark.asyncio
async def test_the_http_client_speaks_server_side_apply():
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "DELETE":
            return httpx.Response(404, json={"message": "not found"})
        if request.method == "GET":
            return httpx.Response(200, json={"items": [{"metadata": {"name": "demo-v1"}}]})
        if "forbidden" in request.url.path:
            return httpx.Response(403, json={"message": "deployments.apps is forbidden"})
        return httpx.Response(200, json=json.loads(request.content))

    api = KubeHTTPAPI("https://k8s.example:6443", token="sa-token", transport=httpx.MockTransport(answer))
    manifest = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "demo-v1", "namespace": NS},
                "spec": {"replicas": 2}}
    assert (await api.apply(manifest))["spec"] == {"replicas": 2}
    assert await api.list("Deployment", NS, {"b": "2", "a": "1"}) == [{"metadata": {"name": "demo-v1"}}]
    assert await api.delete("Service", NS, "demo-v1") is False
    with pytest.raises(KubeAPIError, match="403 deployments.apps is forbidden"):
        await api.apply({**manifest, "metadata": {"name": "forbidden", "namespace": NS}})
    await api.close()

    patch, get, delete = seen[:3]
    assert (patch.method, patch.url.path) == ("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/demo-v1")
    assert dict(patch.url.params) == {"fieldManager": "mindmotor-deployer", "force": "true"}
    assert patch.headers["content-type"] == "application/apply-patch+yaml"
    assert patch.headers["authorization"] == "Bearer sa-token"
    assert (get.url.path, get.url.params["labelSelector"]) == (f"/apis/apps/v1/namespaces/{NS}/deployments", "a=1,b=2")
    assert (delete.method, delete.url.path) == ("DELETE", f"/api/v1/namespaces/{NS}/services/demo-v1")
