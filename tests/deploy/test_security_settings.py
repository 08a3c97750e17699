"""docker-compose.yml and deploy/kubernetes run with security on: no secret on any command line
(only the `--*-file` flags), secrets from the shell (compose) or from Secrets (Kubernetes), the
Kubernetes coordinator serving HTTPS with its certificate and API keys from Secret volumes, its
probes and Prometheus speaking HTTPS to it."""

from __future__ import annotations

import pytest

from . import artifacts as A

SECRET_VALUE_FLAGS = ("--api-key", "--admin-token", "--redis-url", "--controller-token")
COMPOSE = A.compose_services()
K8S = A.k8s_services()


@pytest.mark.parametrize("service", COMPOSE + [s for _, _, s in K8S], ids=lambda s: s.where)
def test_no_secret_on_a_command_line(service):
    assert not [a for a in service.argv if a in SECRET_VALUE_FLAGS or
                any(a.startswith(f + "=") for f in SECRET_VALUE_FLAGS)], service.argv
    assert not any("redis://" in a and "@" in a for a in service.argv), service.argv


def test_compose_secrets_come_from_the_shell():
    by_name = {s.name: s for s in COMPOSE}
    assert by_name["controller"].env["MINDMOTOR_ADMIN_TOKEN"].startswith("${MINDMOTOR_ADMIN_TOKEN:?")
    assert by_name["coordinator"].env["MINDMOTOR_API_KEYS"].startswith("${MINDMOTOR_API_KEYS:?")


def test_kubernetes_secrets_come_from_secrets():
    for workload, container, service in K8S:
        for item in container.get("env") or []:
            if item["name"] in ("MINDMOTOR_ADMIN_TOKEN", "MINDMOTOR_API_KEYS", "MINDMOTOR_CONTROLLER_TOKEN"):
                assert "secretKeyRef" in (item.get("valueFrom") or {}), (service.where, item)
        if service.command == "controller":
            assert service.env.get("MINDMOTOR_ADMIN_TOKEN") == "from-a-secret", service.where


def test_the_kubernetes_coordinator_serves_https_with_keys_from_secrets():
    docs = A.k8s_docs()
    mounts = A.secret_mounts(docs)
    coordinators = [(w, c, s) for w, c, s in A.k8s_services(docs) if s.command == "coordinator"]
    assert coordinators
    for workload, container, service in coordinators:
        args = service.args
        for path in (args.https_cert, args.https_key, args.api_key_file):
            assert path and any(path.startswith(m.rstrip("/") + "/") for m in mounts), (service.where, path)
        settings = A.coordinator_settings(service)
        assert settings.scheme == "https" and settings.api_key_file
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            if kind in container:
                assert container[kind]["httpGet"].get("scheme") == "HTTPS", (service.where, kind)
        assert workload["spec"]["template"]["metadata"]["annotations"].get("prometheus.io/scheme") == "https"
    jobs = {j["job_name"]: j for j in A.load_yaml(A.PROMETHEUS_K8S)["scrape_configs"]}
    assert jobs["mindmotor-coordinator"].get("scheme") == "https"
