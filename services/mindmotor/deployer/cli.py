"""Deployer commands for `mindmotor`:

    mindmotor deployer --port 50070 --controller 127.0.0.1:50050 [--backend local|kubernetes]
        [--metrics-port N] [--coordinator http://127.0.0.1:8000] [--analysis-error-margin F] ...
        # secrets from $MINDMOTOR_REDIS_URL, $MINDMOTOR_ADMIN_TOKEN (or --redis-url-file, --admin-token-file)
    mindmotor deploy apply -f SPEC.yaml | get NAME | list | delete NAME
    mindmotor deploy traffic NAME v1=90 v2=10 [--adapter LORA]   # --adapter: that adapter's own split
    mindmotor deploy rollout NAME --version v2 --checkpoint DIR --canary 10 [--allow-tokenizer-change]
        [--error-margin F] [--ttft-margin F] [--window S] [--min-requests N] [--no-analysis]
    mindmotor deploy rollout NAME --version v2 --adapter LORA=DIR --canary 10   # a new adapter version
    mindmotor deploy promote NAME | rollback NAME

`deployer` prints `MINDMOTOR_DEPLOYER_READY port=N metrics_port=M` on stdout once it serves (with
`--port 0` a free port is picked); every flag of `deployer` has a `MINDMOTOR_*` environment variable
and a key in its `--config` YAML file (deployer/config.py), flags winning over the environment, which
wins over the file; logs are JSON lines on stderr; SIGTERM drains its local replicas
and exits. `deploy` talks to it (`--deployer`, default $MINDMOTOR_DEPLOYER, else the deployer of the
`mindmotor up` running on `--state-dir` — its address and admin certificate from its `up.json` — else
127.0.0.1:50070;
`--admin-token-file`, default $MINDMOTOR_ADMIN_TOKEN); exit status 0 done, 1 refused or failed (the
reason on stderr), 2 a spec or arguments that are wrong before anything is sent. Nothing heavy is
imported until a command runs.
"""

from __future__ import annotations

import argparse
import os
import sys

from mindmotor.common.exposure import add_admin_arguments
from mindmotor.common.settings_flags import Flags, SettingsHelpFormatter

EXIT_REFUSED, EXIT_USAGE = 1, 2
DEFAULT_DEPLOYER = "127.0.0.1:50070"


class CommandFailed(Exception):
    """The call went through but did not achieve what the command promises (a failed rollout)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_deployer(subparsers)
    _register_deploy(subparsers)


# ---- mindmotor deployer -----------------------------------------------------------------------
FLAGS = Flags("mindmotor.deployer.config:DeployerConfig")


def _register_deployer(subparsers) -> None:
    parser = subparsers.add_parser("deployer", help="run the Deployer (deployments, rollouts, traffic)",
                                   description="Run the Deployer: deployment specs into running workers.",
                                   formatter_class=SettingsHelpFormatter)
    add = FLAGS.add
    FLAGS.add_config(parser)
    net = parser.add_argument_group("serving")
    add(net, "--host", help="address to listen on (default: %(default)s); beyond loopback it needs an admin token")
    add(net, "--port", type=int, help="gRPC port; 0 picks a free one (default: %(default)s)")
    add(net, "--metrics-port", type=int, help="Prometheus /metrics port; 0 picks a free one (default: %(default)s)")
    add_admin_arguments(net, "every Deployer call", FLAGS)
    add(net, "--log-level", help="(default: %(default)s)")

    from mindmotor.common.rpc_args import add_arguments as add_rpc_arguments

    add_rpc_arguments(parser)
    ctl = parser.add_argument_group("cluster")
    add(ctl, "--controller", metavar="HOST:PORT[,HOST:PORT]", setting="controllers",
        help="the controller(s) replicas register with and traffic weights go to (required)")
    add(ctl, "--controller-token-file", metavar="FILE",
        help="file holding the controller's admin token, for SetTraffic "
             "(default: $MINDMOTOR_CONTROLLER_TOKEN, else the admin token)")
    add(ctl, "--controller-token", help="the token itself (discouraged)")
    add(ctl, "--backend", choices=("local", "kubernetes"), help="where replicas run (default: %(default)s)")
    add(ctl, "--redis-url-file", metavar="FILE",
        help="file holding the URL of a Redis to keep deployments in, so a restarted deployer "
             "recovers them (default: $MINDMOTOR_REDIS_URL; none: in memory)")
    add(ctl, "--redis-url", help="the URL itself (discouraged when it holds a password: use $MINDMOTOR_REDIS_URL "
                                 "or the file)")
    add(ctl, "--redis-prefix",
        help="prefix of every Redis key; the deployer's are under <prefix>deployer: (default: %(default)s)")
    add(ctl, "--store-file", metavar="FILE",
        help="without Redis: keep the deployments in this JSON file, so a restarted deployer recovers "
             "them (one deployer per file; `mindmotor up` uses its state directory's)")

    timing = parser.add_argument_group("reconcile")
    add(timing, "--reconcile-interval", type=float, setting="reconcile_interval_s",
        help="seconds between reconcile passes (also one after every change) (default: %(default)s)")
    add(timing, "--rollout-timeout", type=float, setting="rollout_timeout_s",
        help="seconds a rollout's replicas have to become ready (default: %(default)s)")
    add(timing, "--drain-timeout", type=float, setting="drain_timeout_s",
        help="local replicas: seconds a draining replica gets before SIGKILL (default: %(default)s)")
    add(timing, "--orphan-grace", type=float, setting="orphan_grace_s",
        help="after the store lost its data (its epoch changed): seconds replicas no deployment "
             "record names are kept, waiting for their specs to be applied again (default: %(default)s)")
    add(timing, "--restart-backoff", type=float, setting="restart_initial_s",
        help="first delay before a crashed replica is restarted; doubles per quick crash "
             "(default: %(default)s)")
    add(timing, "--restart-backoff-max", type=float, setting="restart_max_s", help="(default: %(default)s)")
    add(timing, "--lease-ttl", type=float, setting="lease_ttl_s",
        help="seconds of the owner lease: of several deployers sharing one Redis prefix, the "
             "holder acts and the others stand by, taking over within two periods "
             "(default: %(default)s)")
    add(timing, "--deployer-id", help="the lease holder's name (default: host-pid-random)")

    canary = parser.add_argument_group("canary analysis (defaults for every rollout; see docs/operations.md)")
    add(canary, "--coordinator", action="append", metavar="URL[,URL]", setting="coordinators",
        help="a coordinator's HTTP base URL (http://host:port) whose /metrics (per-version requests, "
             "errors, TTFT) judge canaries; repeatable. None: no automatic rollback")
    add(canary, "--analysis-error-margin", type=float, setting="analysis.max_error_rate_increase",
        help="a canary fails when its error rate exceeds the previous version's by more than this "
             "fraction of requests; < 0: not judged (default: %(default)s)")
    add(canary, "--analysis-ttft-margin", type=float, setting="analysis.max_ttft_p90_increase",
        help="... or its p90 TTFT exceeds the previous version's by more than this fraction; "
             "< 0: not judged (default: %(default)s)")
    add(canary, "--analysis-window", type=float, setting="analysis.window_s",
        help="seconds of figures judged, from the start of the canary phase (default: %(default)s)")
    add(canary, "--analysis-min-requests", type=int, setting="analysis.min_requests",
        help="requests the canary needs in the window before it is judged (default: %(default)s)")

    local = parser.add_argument_group("local backend")
    add(local, "--log-dir", help="replica logs (default: a temporary directory)")
    add(local, "--worker-host", help="address local replicas listen on and advertise (default: %(default)s)")
    add(local, "--worker-ca-cert", metavar="FILE",
        help="under mutual TLS: the worker CA that gives each replica its own certificate "
             "mindmotor://worker/<instance id> (`mindmotor certs worker-ca`; "
             "default: $MINDMOTOR_WORKER_CA_CERT)")
    add(local, "--worker-ca-key", metavar="FILE", help="its key, mode 0600 (default: $MINDMOTOR_WORKER_CA_KEY)")

    k8s = parser.add_argument_group("kubernetes backend")
    add(k8s, "--k8s-namespace", setting="kubernetes.namespace", help="(default: %(default)s)")
    add(k8s, "--k8s-image", setting="kubernetes.image", help="worker image (default: %(default)s)")
    add(k8s, "--k8s-controller", setting="kubernetes.controller",
        help="the controller as pods reach it (default: --controller)")
    add(k8s, "--k8s-checkpoint-claim", setting="kubernetes.checkpoint_claim",
        help="PersistentVolumeClaim with the checkpoints, mounted read-only in every pod")
    add(k8s, "--k8s-checkpoint-mount", setting="kubernetes.checkpoint_mount", help="(default: %(default)s)")
    add(k8s, "--k8s-api-server", setting="kubernetes.api_server",
        help="API server URL, e.g. http://127.0.0.1:8001 via `kubectl proxy` (default: in-cluster)")
    parser.set_defaults(func=run_deployer)


def config_from_args(args: argparse.Namespace):
    """The deployer's settings: the flags given, then $MINDMOTOR_*, then the --config file.
    ValueError (pydantic's ValidationError) for inconsistent values, FileNotFoundError for a
    missing file."""
    return FLAGS.load(args)


def run_deployer(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from mindmotor.common.logging import setup_logging
    from mindmotor.common.settings import error_text
    from mindmotor.common.store import StoreUnavailable

    # Local replicas are forked and exec'd at once (runtime.detached_process): gRPC's fork handlers have
    # nothing to protect there and would only print a warning line per replica on stderr.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    setup_logging("deployer", args.log_level or "INFO")
    log = logging.getLogger("mindmotor.deployer")
    try:
        config = config_from_args(args)
    except (ValueError, OSError) as exc:             # bad settings (one line each), a missing file
        log.error("deployer failed", extra={"error": error_text(exc, FLAGS.settings)})
        return 1
    setup_logging("deployer", config.log_level)
    try:
        from mindmotor.common.rpc import configure_from_args

        configure_from_args(args)
        from .server import serve

        return asyncio.run(serve(config))
    except (ValueError, OSError, StoreUnavailable) as exc:    # bad TLS files, port in use, no Redis, no cluster
        log.error("deployer failed", extra={"error": f"{type(exc).__name__}: {exc}"})
        return 1


# ---- mindmotor deploy ... ---------------------------------------------------------------------
def _register_deploy(subparsers) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--deployer", default=os.environ.get("MINDMOTOR_DEPLOYER") or None, metavar="HOST:PORT",
                        help="the deployer's gRPC address (default: $MINDMOTOR_DEPLOYER, else the running "
                             f"`mindmotor up`'s, found in its state directory, else {DEFAULT_DEPLOYER})")
    common.add_argument("--state-dir", default=None, metavar="DIR",
                        help="the state directory of the `mindmotor up` to talk to when no --deployer is given: "
                             "its deployer and admin certificate (default: $MINDMOTOR_STATE_DIR, else "
                             "$XDG_DATA_HOME/mindmotor, i.e. ~/.local/share/mindmotor)")
    common.add_argument("--admin-token-file", default=None, metavar="FILE",
                        help="file holding the Deployer's admin token (default: $MINDMOTOR_ADMIN_TOKEN)")
    common.add_argument("--admin-token", default=None, help="the token itself (discouraged)")
    common.add_argument("--json", action="store_true", help="print the deployment(s) as JSON")
    from mindmotor.common.rpc_args import add_arguments as add_rpc_arguments

    add_rpc_arguments(common)

    parser = subparsers.add_parser("deploy", help="apply, inspect, shift traffic of and roll out deployments",
                                   description="Talk to the Deployer.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    apply = actions.add_parser("apply", parents=[common], help="create or update a deployment from a spec file")
    apply.add_argument("-f", "--file", required=True, help="the spec (YAML or JSON; see examples/deployments/)")
    apply.add_argument("--allow-tokenizer-change", action="store_true",
                       help="accept new versions whose tokenizer or chat template differs from the serving ones'")
    apply.set_defaults(func=cmd_apply)
    get = actions.add_parser("get", parents=[common], help="one deployment: spec, replicas, traffic, rollout")
    get.add_argument("name")
    get.set_defaults(func=cmd_get)
    actions.add_parser("list", parents=[common], help="every deployment").set_defaults(func=cmd_list)
    delete = actions.add_parser("delete", parents=[common], help="drain and remove a deployment")
    delete.add_argument("name")
    delete.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds until it is gone")
    delete.set_defaults(func=cmd_delete)
    traffic = actions.add_parser("traffic", parents=[common], help="set the traffic weights between versions")
    traffic.add_argument("name")
    traffic.add_argument("weights", nargs="*", metavar="VERSION=WEIGHT")
    traffic.add_argument("--adapter", default="", metavar="LORA",
                         help="set this LoRA adapter's own split (no weights: clear it, the model's applies)")
    traffic.set_defaults(func=cmd_traffic)
    rollout = actions.add_parser("rollout", parents=[common],
                                 help="start a new version and give it a canary share once it is ready")
    rollout.add_argument("name")
    rollout.add_argument("--version", required=True, help="the new version's name")
    rollout.add_argument("--checkpoint", default="", help="its checkpoint directory (default: the bundled model)")
    rollout.add_argument("--adapter", default="", metavar="LORA=DIR",
                         help="a new version of one LoRA adapter instead: the previous version's workers with LORA "
                              "served from DIR; --canary percent of LORA's requests alone go to it (docs/lora.md)")
    rollout.add_argument("--canary", type=float, default=10.0, help="percent of the traffic (default: %(default)s)")
    rollout.add_argument("--replicas", type=int, default=0, help="(default: as many as the version it replaces)")
    rollout.add_argument("--previous", default="", help="the version it replaces (default: the only one)")
    rollout.add_argument("--timeout", type=float, default=0.0,
                         help="seconds its replicas have to become ready (default: the deployer's --rollout-timeout)")
    rollout.add_argument("--no-wait", action="store_true", help="return once the rollout is recorded")
    rollout.add_argument("--allow-tokenizer-change", action="store_true",
                         help="accept a checkpoint whose tokenizer or chat template differs from the previous "
                              "version's (each request is then tokenized by the version that serves it)")
    judged = rollout.add_argument_group("canary analysis (default: the deployer's --analysis-* settings)")
    judged.add_argument("--error-margin", type=float, default=0.0, metavar="FRACTION",
                        help="roll back when the canary's error rate exceeds the previous version's by more")
    judged.add_argument("--ttft-margin", type=float, default=0.0, metavar="FRACTION",
                        help="roll back when the canary's p90 TTFT exceeds the previous version's by more")
    judged.add_argument("--window", type=float, default=0.0, metavar="S", help="seconds of figures judged")
    judged.add_argument("--min-requests", type=int, default=0, help="canary requests needed before judging")
    judged.add_argument("--no-analysis", action="store_true", help="no automatic rollback for this rollout")
    rollout.set_defaults(func=cmd_rollout)
    promote = actions.add_parser("promote", parents=[common], help="give the canary all the traffic, remove the old")
    promote.add_argument("name")
    promote.set_defaults(func=cmd_promote)
    rollback = actions.add_parser("rollback", parents=[common], help="abandon a rollout, restore the traffic")
    rollback.add_argument("name")
    rollback.add_argument("--reason", default="", help="stored with the rollout")
    rollback.set_defaults(func=cmd_rollback)


def _find_up(args) -> None:
    """Without --deployer (or $MINDMOTOR_DEPLOYER): the deployer of the `mindmotor up` running on
    the state directory, and — unless TLS files are given by flag or environment — its admin
    certificate (common/up_state.py); no such `up`: the default address."""
    from mindmotor.common.rpc_args import ENV_CA, ENV_CERT, ENV_KEY
    from mindmotor.common.up_state import running_up

    args.found_up = None
    if args.deployer:
        return
    up = args.found_up = running_up(args.state_dir)
    args.deployer = up["deployer"] if up else DEFAULT_DEPLOYER
    tls_given = any((args.tls_ca, args.tls_cert, args.tls_key)) or any(os.environ.get(n) for n in (ENV_CA, ENV_CERT, ENV_KEY))
    if up and not tls_given and all((up.get("tls") or {}).get(k) for k in ("ca", "cert", "key")):
        args.tls_ca, args.tls_cert, args.tls_key = up["tls"]["ca"], up["tls"]["cert"], up["tls"]["key"]


def _client(args):
    from mindmotor.common.rpc import configure_from_args
    from mindmotor.common.secrets import ADMIN_TOKEN_ENV, secret

    from .client import DeployerClient

    _find_up(args)
    configure_from_args(args)
    return DeployerClient(args.deployer, secret("admin token", args.admin_token, args.admin_token_file,
                                                ADMIN_TOKEN_ENV))


def _hint(args, exc) -> str:
    """What the refusal's details do not say: no `up` was found (the default address refused), the
    `up` found wants its admin token, or the deployer wants TLS (`_tls_hint`)."""
    import grpc

    from mindmotor.common.up_state import default_state_dir

    code, details = exc.code(), (exc.details() or "").lower()
    up = getattr(args, "found_up", None)
    if code == grpc.StatusCode.UNAVAILABLE and "refused" in details and up is None and args.deployer == DEFAULT_DEPLOYER:
        return (f"\n  no `mindmotor up` is running on the state directory {args.state_dir or default_state_dir()} "
                "and nothing answers at the default address: start one, or give --state-dir or --deployer")
    if code == grpc.StatusCode.UNAUTHENTICATED and up and up.get("admin_token"):
        return "\n  this `mindmotor up` has an admin token: set $MINDMOTOR_ADMIN_TOKEN or give --admin-token-file"
    return _tls_hint(exc)


def _tls_hint(exc) -> str:
    """Why a plaintext client's connection was closed: a TLS deployer drops it in the handshake
    ("Socket closed"), which names no cause; nothing listening is "Connection refused" instead."""
    import grpc

    from mindmotor.common.rpc import security

    details = exc.details() or ""
    if exc.code() != grpc.StatusCode.UNAVAILABLE or security().tls or "refused" in details.lower():
        return ""
    return ("\n  if the deployer requires TLS client certificates (every deployer `mindmotor up` starts does): "
            "give --tls-ca, --tls-cert and --tls-key (or MINDMOTOR_TLS_CA/_CERT/_KEY), e.g. the admin "
            "certificate in `mindmotor up`'s state directory (found without flags while that `up` runs)")


def _run(args, call) -> int:
    """Run `call(client)` and print what it returns; a refusal is a message on stderr and exit 1."""
    import grpc

    from .show import print_deployments

    from mindmotor.common.redact import redact

    try:
        client = _client(args)
    except ValueError as exc:          # an unreadable token file
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    try:
        with client:
            result = call(client)
    except grpc.RpcError as exc:
        print(redact(f"deployer {args.deployer}: {exc.code().name}: {exc.details()}{_hint(args, exc)}"), file=sys.stderr)
        return EXIT_REFUSED
    except (TimeoutError, CommandFailed) as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_REFUSED
    print_deployments(result if isinstance(result, list) else [result], as_json=args.json)
    return 0


def cmd_apply(args) -> int:
    from .spec import SpecError, load_spec

    try:
        spec = load_spec(args.file)
    except SpecError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    return _run(args, lambda client: client.apply(spec, allow_tokenizer_change=args.allow_tokenizer_change))


def cmd_get(args) -> int:
    return _run(args, lambda client: client.get(args.name))


def cmd_list(args) -> int:
    return _run(args, lambda client: client.list())


def cmd_delete(args) -> int:
    def call(client):
        deployment = client.delete(args.name)
        if args.wait:
            client.wait_gone(args.name, args.wait)
        return deployment

    return _run(args, call)


def cmd_traffic(args) -> int:
    if not args.weights and not args.adapter:
        print("traffic: give VERSION=WEIGHT ... (none only with --adapter, to clear its split)", file=sys.stderr)
        return EXIT_USAGE
    weights = {}
    for item in args.weights:
        version, sep, weight = item.partition("=")
        try:
            weights[version] = float(weight)
        except ValueError:
            sep = ""
        if not sep or not version:
            print(f"traffic: expected VERSION=WEIGHT, got {item!r}", file=sys.stderr)
            return EXIT_USAGE
    return _run(args, lambda client: client.set_traffic(args.name, weights, adapter=args.adapter))


def cmd_rollout(args) -> int:
    from pathlib import Path

    from mindmotor.vocabulary import RolloutPhase

    checkpoint = str(Path(args.checkpoint).expanduser().resolve()) if args.checkpoint else ""
    adapter, adapter_path = "", ""
    if args.adapter:
        adapter, sep, adapter_path = args.adapter.partition("=")
        if not sep or not adapter or not adapter_path:
            print(f"rollout: --adapter takes LORA=DIR, got {args.adapter!r}", file=sys.stderr)
            return EXIT_USAGE
        adapter_path = str(Path(adapter_path).expanduser().resolve())

    def call(client):
        deployment = client.rollout(args.name, args.version, checkpoint, args.canary, args.replicas, args.previous,
                                    args.timeout, allow_tokenizer_change=args.allow_tokenizer_change,
                                    analysis={"max_error_rate_increase": args.error_margin,
                                              "max_ttft_p90_increase": args.ttft_margin, "window_s": args.window,
                                              "min_requests": args.min_requests},
                                    disable_analysis=args.no_analysis, adapter=adapter, adapter_path=adapter_path)
        if args.no_wait:
            return deployment
        deployment = client.wait_rollout(args.name, timeout_s=deployment.rollout.deadline - deployment.updated_at + 30)
        if deployment.rollout.phase != RolloutPhase.CANARY:
            raise CommandFailed(f"rollout of {args.version} {deployment.rollout.phase}: {deployment.rollout.reason}")
        return deployment

    return _run(args, call)


def cmd_promote(args) -> int:
    return _run(args, lambda client: client.promote(args.name))


def cmd_rollback(args) -> int:
    return _run(args, lambda client: client.rollback(args.name, args.reason))
