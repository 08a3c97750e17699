#!/usr/bin/env python3
"""Container health check for MindMotor services (installed in the image as `mindmotor-healthcheck`).

    mindmotor-healthcheck grpc 127.0.0.1:50051          # standard gRPC health: SERVING -> exit 0
    mindmotor-healthcheck grpc 127.0.0.1:50050 mindmotor.v1.Controller
    mindmotor-healthcheck http http://127.0.0.1:8000/ready   # HTTP 2xx -> exit 0

Exit 0 when healthy, 1 otherwise (with the reason on stderr), as Docker's HEALTHCHECK expects.
Kubernetes does not need it: its probes speak gRPC health and HTTP themselves.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

TIMEOUT_S = 3.0


def check_grpc(address: str, service: str = "") -> str | None:
    """None when the server reports SERVING for `service`, else the reason."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S)
        except grpc.RpcError as exc:
            return f"{address}: {exc.code().name}: {exc.details()}"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"{address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
    return None


def check_http(url: str) -> str | None:
    """None when GET `url` answers 2xx, else the reason."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        return f"{url}: HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url}: {exc}"
    return None if 200 <= status < 300 else f"{url}: HTTP {status}"


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "grpc" and len(argv) <= 3:
        problem = check_grpc(*argv[1:])
    elif len(argv) == 2 and argv[0] == "http":
        problem = check_http(argv[1])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    if problem:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
