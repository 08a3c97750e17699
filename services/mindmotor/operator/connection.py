"""Where the Kubernetes API is and how to authenticate, resolved once and given to both clients
the operator has: kopf's (it watches and patches InferenceServices) and the backend's
`KubeHTTPAPI` (it applies Deployments and Services).

In a pod: the service account (token and CA under /var/run/secrets/kubernetes.io/serviceaccount,
the API at $KUBERNETES_SERVICE_HOST). Elsewhere: `--k8s-api-server URL` with `--k8s-token-file`
and `--k8s-ca` as needed (`kubectl proxy` gives http://127.0.0.1:8001 with no token).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mindmotor.deployer.backends.kube_api import SERVICE_ACCOUNT, KubeHTTPAPI


@dataclass(frozen=True)
class Connection:
    server: str
    token: str | None = None
    ca_path: str | None = None
    insecure: bool = False

    @classmethod
    def resolve(cls, server: str | None = None, token_file: str | None = None, ca_path: str | None = None,
                insecure: bool = False) -> "Connection":
        """ValueError when there is no API to reach (not in a pod, no --k8s-api-server)."""
        if server is None:
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise ValueError("not inside a Kubernetes pod (no KUBERNETES_SERVICE_HOST); give --k8s-api-server")
            server = f"https://{host}:{port}"
            token_file = token_file or _existing(SERVICE_ACCOUNT / "token")
            ca_path = ca_path or _existing(SERVICE_ACCOUNT / "ca.crt")
        token = Path(token_file).read_text().strip() if token_file else None
        return cls(server.rstrip("/"), token or None, ca_path, insecure)

    def kube_api(self, field_manager: str) -> KubeHTTPAPI:
        verify: str | bool = False if self.insecure else (self.ca_path or True)
        return KubeHTTPAPI(self.server, token=self.token, verify=verify, field_manager=field_manager)

    def kopf_login(self):
        import kopf

        return kopf.ConnectionInfo(server=self.server, token=self.token, scheme="Bearer" if self.token else None,
                                   ca_path=self.ca_path, insecure=self.insecure or None)


def _existing(path: Path) -> str | None:
    return str(path) if path.is_file() else None
