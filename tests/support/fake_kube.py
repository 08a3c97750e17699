"""`InMemoryKubeAPI`: a stand-in for the Kubernetes API server, for these tests only — no cluster
can run where the suite runs, so the kubernetes backend is driven against this instead. It keeps
objects by (kind, namespace, name), applies a manifest like server-side apply does for the fields
the backend sets (metadata and spec replaced; status is the cluster's, kept), filters by labels,
and refuses objects a real API server would refuse for the reasons checked in `check_object`.
It does not run pods: a test sets `status.readyReplicas` with `set_ready`."""

from __future__ import annotations

import copy
import re
from typing import Any

from mindmotor.deployer.backends.kube_api import KubeAPI

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def check_object(obj: dict[str, Any]) -> None:
    """AssertionError for what an API server would refuse (the subset the backend could get wrong)."""
    assert obj["apiVersion"] == {"Deployment": "apps/v1", "Service": "v1"}[obj["kind"]]
    metadata = obj["metadata"]
    assert DNS_LABEL.match(metadata["name"]), f"invalid name {metadata['name']!r}"
    assert metadata["namespace"]
    for key, value in metadata.get("labels", {}).items():
        assert len(value) <= 63 and re.match(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]?$", value), (key, value)
    spec = obj["spec"]
    if obj["kind"] == "Deployment":
        selector, template = spec["selector"]["matchLabels"], spec["template"]["metadata"]["labels"]
        assert selector.items() <= template.items(), "selector does not select the template's pods"
        assert isinstance(spec["replicas"], int) and spec["replicas"] >= 0
        for container in spec["template"]["spec"]["containers"]:
            assert container["name"] and container["image"]
            assert all(isinstance(a, str) for a in container["command"] + container["args"])
            assert all(len(p["name"]) <= 15 for p in container["ports"])      # IANA_SVC_NAME
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert container[probe]["grpc"]["port"] in {p["containerPort"] for p in container["ports"]}
    else:
        assert spec["selector"] and all(p["port"] > 0 for p in spec["ports"])


class InMemoryKubeAPI(KubeAPI):
    def __init__(self):
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str, str]] = []

    async def apply(self, manifest):
        check_object(manifest)
        key = (manifest["kind"], manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        self.calls.append(("apply", key[0], key[2]))
        stored = copy.deepcopy(manifest)
        stored["status"] = self.objects.get(key, {}).get("status", {})
        self.objects[key] = stored
        return copy.deepcopy(stored)

    async def list(self, kind, namespace, labels):
        return [copy.deepcopy(o) for (k, ns, _), o in sorted(self.objects.items())
                if k == kind and ns == namespace and labels.items() <= o["metadata"].get("labels", {}).items()]

    async def delete(self, kind, namespace, name):
        self.calls.append(("delete", kind, name))
        return self.objects.pop((kind, namespace, name), None) is not None

    def set_ready(self, namespace: str, name: str, ready: int) -> None:
        self.objects[("Deployment", namespace, name)]["status"] = {"readyReplicas": ready}

    def deployments(self) -> dict[str, int]:
        """name -> spec.replicas of every Deployment."""
        return {name: o["spec"]["replicas"] for (kind, _, name), o in self.objects.items() if kind == "Deployment"}
