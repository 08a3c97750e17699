"""deploy/kubernetes: coordinators scale on CPU. The HorizontalPodAutoscaler (autoscaling/v2; its
schema is checked with every other object by test_kubernetes.py) names the coordinator Deployment
that exists, scales it on CPU utilization — which the Deployment's containers request, else the
autoscaler has no figure — and owns the replica count alone."""

from __future__ import annotations

from . import artifacts as A

DOCS = [d for _, d in A.k8s_docs()]
HPAS = [d for d in DOCS if d["kind"] == "HorizontalPodAutoscaler"]


def _target(hpa: dict) -> dict:
    ref = hpa["spec"]["scaleTargetRef"]
    (workload,) = [d for d in DOCS if d["kind"] == ref["kind"] and d["apiVersion"] == ref["apiVersion"]
                   and d["metadata"]["name"] == ref["name"]]
    return workload


def test_the_coordinator_deployment_has_a_cpu_autoscaler():
    (hpa,) = [h for h in HPAS if _target(h)["metadata"]["name"] == "mindmotor-coordinator"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    workload = _target(hpa)
    assert workload["kind"] == "Deployment"
    assert workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "coordinator"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    target = metric["resource"]["target"]
    assert target["type"] == "Utilization" and 0 < target["averageUtilization"] <= 100
    assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_autoscaled_workloads_request_cpu_and_leave_the_count_to_the_autoscaler():
    for hpa in HPAS:
        workload = _target(hpa)
        for container in A.pod_spec(workload)["containers"]:
            assert container.get("resources", {}).get("requests", {}).get("cpu"), \
                f"{workload['metadata']['name']}/{container['name']}: utilization needs a CPU request"
        # a `replicas` in the manifest would reset the autoscaler's count on every `kubectl apply`
        assert "replicas" not in workload["spec"], workload["metadata"]["name"]


def test_the_benchmark_and_the_manifest_agree_on_the_utilization_target():
    """front_door_scale.py derives the replicas a rate needs at the autoscaler's target."""
    text = (A.ROOT / "benchmarks" / "front_door_scale.py").read_text()
    (hpa,) = [h for h in HPAS if h["metadata"]["name"] == "mindmotor-coordinator"]
    target = hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"]
    assert f"HPA_TARGET_UTILIZATION = {target / 100}" in text
