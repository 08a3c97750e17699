"""deploy/kubernetes: well-formed objects, selectors that select, Services that target declared
container ports, probes on the real health endpoints and ports, Prometheus annotations on the
metrics ports the flags open, and every in-cluster address naming a Service that serves it."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from . import artifacts as A

DOCS = A.k8s_docs()
SERVICES = [d for _, d in DOCS if d["kind"] == "Service"]
WORKLOADS = [w for _, w in A.workloads(DOCS)]
MINDMOTOR = A.k8s_services(DOCS)
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass"}


def ids(doc) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


@pytest.mark.parametrize("doc", [d for _, d in DOCS], ids=ids)
def test_object_is_well_formed(doc):
    assert doc.get("apiVersion") and doc.get("kind") and doc.get("metadata", {}).get("name")
    if doc["kind"] not in CLUSTER_SCOPED:
        assert doc["metadata"].get("namespace") == A.NAMESPACE, ids(doc)
    assert doc["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") == "mindmotor", ids(doc)


@pytest.mark.parametrize("doc", [d for _, d in DOCS], ids=ids)
def test_object_validates_against_the_kubernetes_schemas(doc):
    """The Kubernetes API's own OpenAPI schemas (bundled by kubernetes-validate, offline), strict: an
    unknown or misplaced field fails, as `kubectl apply --validate=strict` would."""
    import kubernetes_validate

    kubernetes_validate.validate(doc, "1.31.0", strict=True)


def test_names_are_unique_and_kustomization_lists_every_file():
    keys = [(d["kind"], d["metadata"]["name"]) for _, d in DOCS]
    assert len(keys) == len(set(keys))
    kustomization = A.load_yaml(A.K8S_DIR / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted(p.name for p in A.k8s_files())
    assert kustomization.get("namespace") == A.NAMESPACE


@pytest.mark.parametrize("workload", WORKLOADS, ids=ids)
def test_selector_matches_template_labels(workload):
    selector = workload["spec"]["selector"]["matchLabels"]
    labels = workload["spec"]["template"]["metadata"]["labels"]
    assert selector and selector.items() <= labels.items(), ids(workload)
    others = [w for w in WORKLOADS if w is not workload]
    assert not any(selector.items() <= w["spec"]["template"]["metadata"]["labels"].items() for w in others), \
        f"{ids(workload)}'s selector also selects another workload's pods"


def selected(service: dict) -> list[dict]:
    sel = service["spec"].get("selector") or {}
    return [w for w in WORKLOADS if sel and sel.items() <= w["spec"]["template"]["metadata"]["labels"].items()]


@pytest.mark.parametrize("service", SERVICES, ids=ids)
def test_service_targets_declared_container_ports(service):
    (workload,) = selected(service)
    containers = A.pod_spec(workload)["containers"]
    for port in service["spec"]["ports"]:
        target = port.get("targetPort", port["port"])
        assert any(A.resolve_port(target, c) is not None for c in containers), \
            f"{ids(service)} port {port['port']} -> {target}: no such containerPort in {ids(workload)}"


@pytest.mark.parametrize("workload,container,service", MINDMOTOR, ids=[s.where for _, _, s in MINDMOTOR])
def test_container_ports_are_the_flags_ports(workload, container, service):
    declared = {p["containerPort"] for p in container["ports"]}
    assert declared == set(service.listening_ports().values()), \
        f"{service.where}: containerPorts {declared} vs the flags' {service.listening_ports()}"
    for name, port in service.listening_ports().items():
        assert A.resolve_port(name, container) == port, f"{service.where}: port named {name!r} is not {port}"
    annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
    assert annotations.get("prometheus.io/scrape") == "true"
    assert int(annotations["prometheus.io/port"]) == service.metrics_port()
    assert annotations.get("prometheus.io/path") == "/metrics"


@pytest.mark.parametrize("workload,container,service", MINDMOTOR, ids=[s.where for _, _, s in MINDMOTOR])
def test_probes_use_the_real_health_endpoints(workload, container, service):
    ports = service.listening_ports()
    assert container.get("readinessProbe") and container.get("livenessProbe"), service.where
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(kind)
        if probe is None:
            continue
        if service.command in ("worker", "controller"):
            assert isinstance(probe["grpc"]["port"], int), "grpc probes take a port number"
            assert probe["grpc"]["port"] == ports["grpc"], f"{service.where} {kind}"
        else:
            http = probe["httpGet"]
            assert A.resolve_port(http["port"], container) == ports["http"], f"{service.where} {kind}"
            # /ready gates traffic; /health answers 503 with no routable worker, so it must not
            # be the liveness probe (it would restart healthy coordinators when workers are down)
            assert http["path"] == {"readinessProbe": "/ready", "livenessProbe": "/metrics",
                                    "startupProbe": "/metrics"}[kind], f"{service.where} {kind}"


@pytest.mark.parametrize("workload,container,service", MINDMOTOR, ids=[s.where for _, _, s in MINDMOTOR])
def test_resources_security_and_shutdown(workload, container, service):
    resources = container["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"], service.where
    assert resources["limits"]["memory"], service.where
    pod = A.pod_spec(workload)
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    if service.command == "worker":
        assert pod["terminationGracePeriodSeconds"] > service.settings.drain_timeout_s, "SIGKILL before the drain ends"


def find_service(name: str) -> dict:
    matches = [s for s in SERVICES if s["metadata"]["name"] == name]
    assert matches, f"no Service {name!r}"
    return matches[0]


def service_reaches(address: str, kind: str, listening_port: str) -> None:
    """`address` (NAME:PORT) is a Service whose port PORT forwards to `listening_port` of the
    pods of the mindmotor `kind` it selects."""
    host, port = A.split_address(address)
    svc = find_service(host)
    (spec,) = [p for p in svc["spec"]["ports"] if p["port"] == port]
    (workload,) = selected(svc)
    ((_, container, target),) = [(w, c, s) for w, c, s in MINDMOTOR if w is workload]
    assert target.command == kind, f"{address} reaches a {target.command}, not a {kind}"
    assert A.resolve_port(spec.get("targetPort", port), container) == target.listening_ports()[listening_port], address


def test_in_cluster_addresses_name_services_that_serve_them():
    for _, _, s in MINDMOTOR:
        if s.command == "worker":
            for address in s.settings.controller.split(","):
                service_reaches(address, "controller", "grpc")
        elif s.command == "coordinator":
            for address in A.coordinator_settings(s).controllers:
                service_reaches(address, "controller", "grpc")
        elif s.command == "controller":
            url = urlparse(s.env["MINDMOTOR_REDIS_URL"])
            redis = find_service(url.hostname)
            assert url.port in [p["port"] for p in redis["spec"]["ports"]]
    find_service("mindmotor-coordinator")          # the API's entry point


def test_secrets_and_configmaps_referenced_exist_or_are_documented():
    """The admin and cluster token Secrets are created by the operator (docs/operations.md says how); every
    ConfigMap a pod mounts is in the manifests."""
    configmaps = {d["metadata"]["name"] for _, d in DOCS if d["kind"] == "ConfigMap"}
    secrets = set()
    for w in WORKLOADS:
        for v in A.pod_spec(w).get("volumes") or []:
            if "configMap" in v:
                assert v["configMap"]["name"] in configmaps
        for c in A.pod_spec(w)["containers"]:
            for e in c.get("env") or []:
                ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    secrets.add(ref["name"])
    assert secrets == {"mindmotor-admin", "mindmotor-cluster", "mindmotor-resume-key"}
    operations = (A.ROOT / "docs" / "operations.md").read_text()
    assert "create secret generic mindmotor-admin" in operations
    assert "create secret generic mindmotor-cluster" in operations
    assert "create secret generic mindmotor-resume-key" in operations
