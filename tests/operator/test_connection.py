"""Where the operator finds the Kubernetes API: the pod's service account, or the flags; a clear
error outside a pod without them. Both of its clients (kopf's, the backend's) get the same."""

from __future__ import annotations

import pytest

from mindmotor.operator import connection
from mindmotor.operator.connection import Connection


def test_outside_a_pod_without_a_server_the_error_says_what_to_give(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ValueError, match="give --k8s-api-server"):
        Connection.resolve()


def test_in_a_pod_the_service_account_is_used(monkeypatch, tmp_path):
    (tmp_path / "token").write_text("sa-token\n")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setattr(connection, "SERVICE_ACCOUNT", tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    found = Connection.resolve()
    assert found == Connection("https://10.96.0.1:443", "sa-token", str(tmp_path / "ca.crt"))
    login = found.kopf_login()
    assert (login.server, login.token, login.scheme, login.ca_path) == \
        ("https://10.96.0.1:443", "sa-token", "Bearer", str(tmp_path / "ca.crt"))


def test_flags_win_and_a_proxy_needs_no_token():
    found = Connection.resolve("http://127.0.0.1:8001/")
    assert found == Connection("http://127.0.0.1:8001") and found.kopf_login().token is None
