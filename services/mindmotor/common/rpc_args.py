"""The cluster-security flags every service and gRPC client command takes (common/rpc.py reads
them); importing this costs nothing (command-line parsers are built before anything heavy loads)."""

from __future__ import annotations

ENV_CA, ENV_CERT, ENV_KEY = "MINDMOTOR_TLS_CA", "MINDMOTOR_TLS_CERT", "MINDMOTOR_TLS_KEY"
ENV_TOKEN, ENV_TOKEN_FILE = "MINDMOTOR_CLUSTER_TOKEN", "MINDMOTOR_CLUSTER_TOKEN_FILE"


def add_arguments(parser) -> None:
    group = parser.add_argument_group("cluster security (see docs/security.md)")
    group.add_argument("--tls-ca", default=None, metavar="PEM",
                       help=f"the cluster CA certificate: mutual TLS on every gRPC call (default: ${ENV_CA})")
    group.add_argument("--tls-cert", default=None, metavar="PEM",
                       help=f"this process's certificate from the cluster CA (default: ${ENV_CERT})")
    group.add_argument("--tls-key", default=None, metavar="PEM", help=f"its private key (default: ${ENV_KEY})")
    group.add_argument("--cluster-token-file", default=None, metavar="FILE",
                       help=f"a file holding the cluster token, sent and required on every gRPC call "
                            f"without TLS (default: ${ENV_TOKEN_FILE}, or ${ENV_TOKEN})")
