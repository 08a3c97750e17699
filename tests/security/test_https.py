"""The coordinator over HTTPS, end to end: `mindmotor coordinator --https-cert --https-key
--api-key-file` as a real process in front of a real worker, reached by the unmodified `openai`
client that trusts a test CA (made here); TLS 1.2 and 1.3 accepted, TLS 1.1 and plain HTTP
refused; a wrong or missing API key is a 401 over HTTPS; `/v1/models` names no filesystem path;
no key on the command line."""

from __future__ import annotations

import socket
import ssl

import httpx
import openai
import pytest

from mindmotor.common.waiting import wait_until

from .public_side_support import PKI, Service, clean_env, make_pki, token

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def keys() -> list[str]:
    return [token("sk-https-a"), token("sk-https-b")]


@pytest.fixture(scope="module")
def https(tiny_ckpt, pki, keys, tmp_path_factory):
    """A worker and an HTTPS coordinator in front of it; the keys in a file, one a line."""
    logs = tmp_path_factory.mktemp("https-logs")
    key_file = logs / "api-keys"
    key_file.write_text("# coordinator API keys\n" + "\n".join(keys) + "\n")
    key_file.chmod(0o600)
    worker = Service("worker", ["worker", "--model", str(tiny_ckpt), "--port", "0", "--metrics-port", "0",
                                "--timing", "virtual"], "MINDMOTOR_WORKER_READY", logs / "worker.log", env=clean_env())
    try:
        coordinator = Service("coordinator", [
            "coordinator", "--port", "0", "--worker", f"127.0.0.1:{worker.ready['port']}",
            "--model", f"{tiny_ckpt.name}={tiny_ckpt}", "--api-key-file", str(key_file),
            "--https-cert", str(pki.server_cert), "--https-key", str(pki.server_key)],
            "MINDMOTOR_COORDINATOR_READY", logs / "coordinator.log", env=clean_env())
    except BaseException:
        worker.stop()
        raise
    coordinator.key_file = key_file
    coordinator.port = int(coordinator.ready["port"])
    coordinator.base_url = f"https://127.0.0.1:{coordinator.port}/v1"
    yield coordinator
    coordinator.stop()
    worker.stop()


def trusting(pki: PKI, **versions) -> ssl.SSLContext:
    """A client context that trusts only the test CA (and verifies the host name)."""
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    for name, value in versions.items():
        setattr(context, name, value)
    return context


def test_the_openai_client_over_https(https, pki, keys, tiny_ckpt):
    with httpx.Client(verify=trusting(pki), timeout=30) as http:
        client = openai.OpenAI(base_url=https.base_url, api_key=keys[1], http_client=http, max_retries=0)
        chat = client.chat.completions.create(model=tiny_ckpt.name, max_tokens=4,
                                              messages=[{"role": "user", "content": "hello"}])
        assert chat.choices[0].finish_reason in ("stop", "length") and chat.usage.completion_tokens >= 1
        stream = client.completions.create(model=tiny_ckpt.name, prompt="def f(", max_tokens=4, stream=True)
        assert sum(1 for chunk in stream if chunk.choices and chunk.choices[0].text is not None) >= 1
        models = client.models.list().data
        assert [m.id for m in models] == [tiny_ckpt.name]


def test_models_name_no_filesystem_path(https, pki, keys, tiny_ckpt):
    with httpx.Client(verify=trusting(pki), timeout=30, headers={"Authorization": f"Bearer {keys[0]}"}) as http:
        body = http.get(f"{https.base_url}/models").text
        errors = [http.post(f"{https.base_url}/chat/completions", json=payload).text for payload in (
            {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
            {"model": tiny_ckpt.name, "messages": []},
            {"model": tiny_ckpt.name, "prompt": "x"})]
    card = httpx.Response(200, content=body).json()["data"][0]
    assert card["root"] == tiny_ckpt.name
    for text in [body, *errors]:
        assert str(tiny_ckpt) not in text and str(tiny_ckpt.parent) not in text, text


def test_a_wrong_or_missing_key_is_401_over_https(https, pki):
    with httpx.Client(verify=trusting(pki), timeout=30) as http:
        wrong = openai.OpenAI(base_url=https.base_url, api_key="sk-not-a-key", http_client=http, max_retries=0)
        with pytest.raises(openai.AuthenticationError) as refused:
            wrong.models.list()
        assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
        missing = http.get(f"{https.base_url}/models")
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"


def _handshake(port: int, context: ssl.SSLContext) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.version()


def test_tls_1_2_and_1_3_are_served_1_1_is_refused(https, pki):
    assert _handshake(https.port, trusting(pki, minimum_version=ssl.TLSVersion.TLSv1_3)) == "TLSv1.3"
    assert _handshake(https.port, trusting(pki, maximum_version=ssl.TLSVersion.TLSv1_2)) == "TLSv1.2"
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(cafile=str(pki.ca_cert))
    with pytest.warns(DeprecationWarning):
        old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("ALL:@SECLEVEL=0")   # this client would speak TLS 1.1: the server must say no
    with pytest.raises(ssl.SSLError) as refused:
        _handshake(https.port, old)
    # the server ends the handshake (an alert or, from asyncio's TLS, a close); the client itself
    # could speak TLS 1.1 (else it would fail with NO_PROTOCOLS_AVAILABLE before sending anything)
    assert isinstance(refused.value, ssl.SSLEOFError) or "PROTOCOL_VERSION" in str(refused.value), refused.value


def test_no_plain_http_and_no_untrusted_certificate(https):
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{https.port}/v1/models", timeout=10)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{https.base_url}/models", timeout=10)       # the system CAs do not know the test CA


def test_no_key_on_the_command_line_or_in_the_log(https, keys):
    assert not [k for k in keys if k in https.cmdline()]
    assert "--api-key-file" in https.cmdline()
    log = https.log_text()
    assert '"scheme": "https"' in log and not [k for k in keys if k in log]


def test_keys_rotate_by_editing_the_key_file(https, pki, keys, tiny_ckpt):
    """Last here: it replaces the keys. No restart: the coordinator re-reads the file when it changes."""
    new_key = token("sk-https-new")

    def status(key: str) -> int:
        return http.get(f"{https.base_url}/models", headers={"Authorization": f"Bearer {key}"}).status_code

    with httpx.Client(verify=trusting(pki), timeout=30) as http:
        https.key_file.write_text("\n".join([keys[0], new_key]) + "\n")          # 1. add the new key
        wait_until(lambda: status(new_key) == 200, timeout=20, what="the new key to be accepted")
        assert status(keys[0]) == 200
        https.key_file.write_text(new_key + "\n")                                  # 3. remove the old one
        wait_until(lambda: status(keys[0]) == 401, timeout=20, what="the old key to be refused")
        assert status(new_key) == 200
        https.key_file.write_text("")                              # emptied by mistake: the keys stay
        wait_until(lambda: status(new_key) == 200 and "API key file not reloaded" in https.log_text(),
                   timeout=20, what="the warning (the file is checked when a request comes)")
        assert status(new_key) == 200 and status(keys[0]) == 401
        metrics = http.get(f"{https.base_url.removesuffix('/v1')}/metrics").text
    assert 'mindmotor_coordinator_api_key_reloads_total{outcome="reloaded"} 2.0' in metrics
    assert 'mindmotor_coordinator_api_key_reloads_total{outcome="kept"} 1.0' in metrics
    assert new_key not in https.log_text() and new_key not in https.cmdline()
