"""`KubeAPI`: the three Kubernetes API calls the kubernetes backend needs — apply an object, list
objects by label, delete one — and `KubeHTTPAPI`, which makes them against a real API server
(server-side apply, `application/apply-patch+yaml`, field manager `mindmotor-deployer`, or the
operator's `mindmotor-operator`).

`KubeHTTPAPI.in_cluster()` uses the pod's service account (the token and CA under
/var/run/secrets/kubernetes.io/serviceaccount, the API at $KUBERNETES_SERVICE_HOST); the
deployer's service account needs get/list/create/patch/delete on deployments (apps) and services.

No Kubernetes runs where this project is built and tested: the tests check the requests this
client sends with an HTTP mock transport, and drive the backend with an in-memory fake of this
interface (tests/support/fake_kube.py). Neither is a substitute for a real cluster.
"""

from __future__ import annotations

import abc
import json
import os
from pathlib import Path
from typing import Any

import httpx

FIELD_MANAGER = "mindmotor-deployer"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
COLLECTIONS = {"Deployment": "/apis/apps/v1/namespaces/{namespace}/deployments",
               "Service": "/api/v1/namespaces/{namespace}/services"}


class KubeAPIError(RuntimeError):
    """The API server refused a call (the message has its status and reason)."""


def label_selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


class KubeAPI(abc.ABC):
    @abc.abstractmethod
    async def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create the object or bring it to the manifest (server-side apply); the stored object."""

    @abc.abstractmethod
    async def list(self, kind: str, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        """Objects of `kind` in `namespace` carrying every one of `labels`."""

    @abc.abstractmethod
    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        """True if it existed."""

    async def close(self) -> None:
        return None


class KubeHTTPAPI(KubeAPI):
    def __init__(self, server: str, token: str | None = None, verify: str | bool = True,
                 transport: httpx.AsyncBaseTransport | None = None, field_manager: str = FIELD_MANAGER):
        self.field_manager = field_manager
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.AsyncClient(base_url=server, headers=headers, verify=verify, transport=transport,
                                        timeout=10.0)

    @classmethod
    def in_cluster(cls, server: str | None = None, field_manager: str = FIELD_MANAGER) -> "KubeHTTPAPI":
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if server is None and not host:
            raise ValueError("not inside a Kubernetes pod (no KUBERNETES_SERVICE_HOST); give --k8s-api-server")
        token_file = SERVICE_ACCOUNT / "token"
        ca_file = SERVICE_ACCOUNT / "ca.crt"
        return cls(server or f"https://{host}:{port}",
                   token=token_file.read_text().strip() if token_file.is_file() else None,
                   verify=str(ca_file) if ca_file.is_file() else True, field_manager=field_manager)

    def _path(self, kind: str, namespace: str, name: str | None = None) -> str:
        if kind not in COLLECTIONS:
            raise ValueError(f"unsupported kind {kind!r} (supported: {', '.join(COLLECTIONS)})")
        collection = COLLECTIONS[kind].format(namespace=namespace)
        return collection if name is None else f"{collection}/{name}"

    async def apply(self, manifest):
        metadata = manifest["metadata"]
        response = await self.client.patch(
            self._path(manifest["kind"], metadata["namespace"], metadata["name"]),
            params={"fieldManager": self.field_manager, "force": "true"}, content=json.dumps(manifest),
            headers={"Content-Type": "application/apply-patch+yaml"})
        return _checked(response)

    async def list(self, kind, namespace, labels):
        response = await self.client.get(self._path(kind, namespace), params={"labelSelector": label_selector(labels)})
        return _checked(response).get("items", [])

    async def delete(self, kind, namespace, name):
        response = await self.client.delete(self._path(kind, namespace, name),
                                            params={"propagationPolicy": "Foreground"})
        if response.status_code == 404:
            return False
        _checked(response)
        return True

    async def close(self):
        await self.client.aclose()


def _checked(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        try:
            detail = response.json().get("message", response.text)
        except ValueError:
            detail = response.text
        raise KubeAPIError(f"{response.request.method} {response.request.url.path}: {response.status_code} {detail}")
    return response.json()
