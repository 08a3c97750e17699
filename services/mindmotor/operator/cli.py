"""`mindmotor operator`: run the InferenceService operator.

    mindmotor operator [--namespace NS ... | --all-namespaces] [--image IMG] [--worker-controller ADDR]
        [--controller ADDR] [--checkpoint-claim PVC] [--resync-interval S]
        [--k8s-api-server URL [--k8s-token-file F] [--k8s-ca PEM | --k8s-insecure]]
        # the controller's admin token (SetTraffic) from $MINDMOTOR_CONTROLLER_TOKEN / $MINDMOTOR_ADMIN_TOKEN
        # or --controller-token-file

Prints `MINDMOTOR_OPERATOR_READY namespaces=...` on stdout once it watches; logs go to stderr;
SIGTERM or SIGINT stop it (kopf finishes the handlers that run). Exit status 0 after a signal, 1
when it cannot start (no API to reach, bad flags' files), 2 for wrong arguments. Needs the
`operator` extra (`pip install 'mindmotor[operator]'`: kopf); says so if it is missing.
"""

from __future__ import annotations

import argparse
import os
import sys

READY_PREFIX = "MINDMOTOR_OPERATOR_READY"
DEFAULT_IMAGE = "mindmotor:dev"
DEFAULT_WORKER_CONTROLLER = "mindmotor-controller:50050"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "operator", help="run the InferenceService operator (Kubernetes)",
        description="Reconcile InferenceService objects (serving.mindmotor.io/v1) into worker Deployments, "
                    "traffic weights and status; deploy/kubernetes/operator/ has the CRD and the manifests.")
    where = parser.add_argument_group("what to watch")
    where.add_argument("--namespace", action="append", default=None, metavar="NS",
                       help="a namespace to serve (repeatable; default: $MINDMOTOR_NAMESPACE, else mindmotor)")
    where.add_argument("--all-namespaces", action="store_true", help="serve every namespace (needs a ClusterRole)")
    where.add_argument("--resync-interval", type=float, default=5.0, metavar="S",
                       help="seconds between two passes over one InferenceService (default: %(default)s)")
    pods = parser.add_argument_group("the worker pods")
    pods.add_argument("--image", default=os.environ.get("MINDMOTOR_OPERATOR_IMAGE") or DEFAULT_IMAGE,
                      help="the MindMotor image, unless a spec names one (default: $MINDMOTOR_OPERATOR_IMAGE "
                           "or %(default)s)")
    pods.add_argument("--worker-controller", default=DEFAULT_WORKER_CONTROLLER, metavar="HOST:PORT[,HOST:PORT]",
                      help="the controller(s) the worker pods register with (default: %(default)s)")
    pods.add_argument("--checkpoint-claim", default=None, metavar="PVC",
                      help="a PersistentVolumeClaim holding the checkpoints, mounted read-only in every pod")
    pods.add_argument("--checkpoint-mount", default="/checkpoints", help="where (default: %(default)s)")
    traffic = parser.add_argument_group("traffic")
    traffic.add_argument("--controller", default=None, metavar="HOST:PORT[,HOST:PORT]",
                         help="the controller(s) the traffic weights go to (usually the same as "
                              "--worker-controller); none: weights stay in the status")
    traffic.add_argument("--controller-token-file", default=None, metavar="FILE",
                         help="file holding the controller's admin token (default: $MINDMOTOR_CONTROLLER_TOKEN, "
                              "else $MINDMOTOR_ADMIN_TOKEN)")
    api = parser.add_argument_group("the Kubernetes API (default: the pod's service account)")
    api.add_argument("--k8s-api-server", default=None, metavar="URL", help="e.g. http://127.0.0.1:8001 (kubectl proxy)")
    api.add_argument("--k8s-token-file", default=None, metavar="FILE", help="a bearer token for it")
    api.add_argument("--k8s-ca", default=None, metavar="PEM", help="its CA certificate")
    api.add_argument("--k8s-insecure", action="store_true", help="do not verify its certificate (tests only)")
    parser.add_argument("--log-level", default="INFO", help="(default: %(default)s)")

    from mindmotor.common.rpc_args import add_arguments as add_rpc_arguments

    add_rpc_arguments(parser)
    parser.set_defaults(func=run_operator)


def _controller_token(args: argparse.Namespace) -> str | None:
    if args.controller_token_file:
        with open(args.controller_token_file) as f:
            return f.read().strip() or None
    return os.environ.get("MINDMOTOR_CONTROLLER_TOKEN") or os.environ.get("MINDMOTOR_ADMIN_TOKEN") or None


def run_operator(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from mindmotor.common.logging import setup_logging

    setup_logging("operator", args.log_level)
    log = logging.getLogger("mindmotor.operator")
    import importlib.util

    if importlib.util.find_spec("kopf") is None:
        log.error("operator failed", extra={"error": "kopf is not installed: pip install 'mindmotor[operator]' "
                                                     "(or scripts/install.sh dev)"})
        return 1
    if args.resync_interval <= 0:
        log.error("operator failed", extra={"error": f"--resync-interval must be positive, got {args.resync_interval}"})
        return 2
    try:
        from mindmotor.common.rpc import configure_from_args

        from .connection import Connection

        configure_from_args(args)
        connection = Connection.resolve(args.k8s_api_server, args.k8s_token_file, args.k8s_ca, args.k8s_insecure)
        token = _controller_token(args)
    except (ValueError, OSError) as exc:
        log.error("operator failed", extra={"error": f"{type(exc).__name__}: {exc}"})
        return 1
    namespaces = [] if args.all_namespaces else (args.namespace or [os.environ.get("MINDMOTOR_NAMESPACE") or "mindmotor"])
    asyncio.run(_serve(args, connection, token, namespaces))
    return 0


async def _serve(args: argparse.Namespace, connection, token: str | None, namespaces: list[str]) -> None:
    import asyncio

    import kopf

    from . import handlers
    from .reconcile import MANAGER, ServiceReconciler
    from .traffic import ControllerTraffic, NoTraffic

    if args.controller:
        from mindmotor.deployer.controller_link import ControllerLink

        traffic = ControllerTraffic(ControllerLink(args.controller, admin_token=token))
    else:
        traffic = NoTraffic()
    api = connection.kube_api(MANAGER)
    reconciler = ServiceReconciler(api, args.image, args.worker_controller, traffic, args.checkpoint_claim,
                                   args.checkpoint_mount)
    ready = asyncio.Event()

    async def announce() -> None:
        await ready.wait()
        where = ",".join(namespaces) or "*"
        print(f"{READY_PREFIX} namespaces={where}", file=sys.stdout, flush=True)

    announcer = asyncio.create_task(announce())
    try:
        await kopf.operator(registry=handlers.registry(reconciler, connection, args.resync_interval),
                            settings=handlers.settings(), standalone=True, clusterwide=not namespaces,
                            namespaces=namespaces, ready_flag=ready)
    finally:
        announcer.cancel()
        await api.close()
