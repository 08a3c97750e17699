"""HTTPS on a service's HTTP side ports (its Prometheus /metrics port; the controller's admin
API), with the service's own cluster certificate.

One rule: a process that has cluster TLS material (`--tls-cert/--tls-key`, or
`MINDMOTOR_TLS_CERT/_KEY`; common/rpc.py) serves every HTTP side port over HTTPS (TLS 1.2+)
with that certificate and key; without it, plain HTTP as before. Clients verify the server with
the cluster CA; no client certificate is asked for (Prometheus scrapers and probes have none).
The coordinator's public API is not a side port: it has its own `--https-cert/--https-key`.

The /metrics ports are served by `side_http.SideHTTPServer` (a TLS handshake per connection, on
the connection's own thread, with a deadline and a cap on connections: nobody can freeze the port
by opening a connection and saying nothing)."""

from __future__ import annotations

from prometheus_client import REGISTRY, make_wsgi_app

from mindmotor.common import rpc, side_http


def side_files(sec: rpc.RpcSecurity | None = None) -> tuple[str, str] | None:
    """(certificate file, key file) the side ports serve with, or None (plain HTTP)."""
    sec = rpc.security() if sec is None else sec
    if sec.cert_path and sec.key_path:
        return sec.cert_path, sec.key_path
    return None


def serve_metrics(host: str, port: int, registry=REGISTRY, files: tuple[str, str] | None = None,
                  sec: rpc.RpcSecurity | None = None):
    """prometheus_client's /metrics app on a `SideHTTPServer` on a daemon thread, over HTTPS (TLS
    1.2+) when there are files (`files`, else the process's cluster certificate); returns (server,
    bound port). `server.shutdown()` stops it."""
    files = files if files is not None else side_files(sec)
    tls = side_http.tls_context(*files) if files else None
    server = side_http.SideHTTPServer(host, port, classic_text(make_wsgi_app(registry)), tls=tls)
    side_http.start(server)
    return server, server.server_port


def classic_text(app):
    """prometheus_client's /metrics app answering every scrape in the classic text format. Asked
    for OpenMetrics (which Prometheus asks for first), prometheus_client 0.26 writes a sample name
    with a colon with an underscore (`vllm_num_requests_running` under `# TYPE
    vllm:num_requests_running`), so no vLLM-named series would reach Prometheus."""
    def text_only(environ, start_response):
        return app({k: v for k, v in environ.items() if k != "HTTP_ACCEPT"}, start_response)
    return text_only


def uvicorn_tls(sec: rpc.RpcSecurity | None = None) -> dict[str, str]:
    """uvicorn.Config keyword arguments for an HTTPS side port ({} for plain HTTP)."""
    files = side_files(sec)
    return {"ssl_certfile": files[0], "ssl_keyfile": files[1]} if files else {}
