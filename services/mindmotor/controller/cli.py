"""`mindmotor controller`: the cluster's registry, health checks and routing table.

    MINDMOTOR_REDIS_URL=redis://:PASSWORD@127.0.0.1:6379/0 MINDMOTOR_ADMIN_TOKEN=... \\
    mindmotor controller --port 50050 --admin-port 8090
        [--pd-autoscale --pd-ttft-slo-ms 1000 --pd-tpot-slo-ms 50 --pd-slo deployment=NAME,ttft_ms=..,tpot_ms=..]

With `--port 0` (or `--admin-port 0`) a free port is picked; either way the controller prints
`MINDMOTOR_CONTROLLER_READY port=N admin_port=M` on stdout once it serves. Every flag has a
`MINDMOTOR_*` environment variable and a key in the `--config` YAML file (controller/config.py);
flags win over the environment, which wins over the file. Without a Redis URL
the registry lives in memory (one controller); with one, several controllers share it and one of
them (the lease holder) leads. Logs are JSON lines on stderr. Nothing heavy is imported until the
command runs.
"""

from __future__ import annotations

import argparse

from mindmotor.common.exposure import add_admin_arguments
from mindmotor.common.settings_flags import Flags, SettingsHelpFormatter

FLAGS = Flags("mindmotor.controller.config:ControllerConfig")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("controller", help="run the cluster controller (registry, health, routing)",
                                   description=__doc__.splitlines()[0], formatter_class=SettingsHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run_controller)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = FLAGS.add
    FLAGS.add_config(parser)
    net = parser.add_argument_group("serving")
    add(net, "--host", help="gRPC address to listen on (default: %(default)s)")
    add(net, "--port", type=int, help="gRPC port; 0 picks a free one (default: %(default)s)")
    add(net, "--admin-host", help="admin HTTP address (default: %(default)s); beyond loopback it needs an admin token")
    add(net, "--admin-port", type=int, help="admin HTTP port; 0 picks a free one (default: %(default)s)")
    add_admin_arguments(net, "every admin API call", FLAGS)
    from mindmotor.common.rpc_args import add_arguments as add_rpc_arguments

    add_rpc_arguments(parser)
    add(net, "--controller-id", help="name in logs, metrics and the lease (default: HOST-PID-RANDOM)")
    add(net, "--log-level", help="(default: %(default)s)")

    store = parser.add_argument_group("store")
    add(store, "--redis-url-file", metavar="FILE",
        help="file holding the URL of the Redis for the registry and the leader lease "
             "(default: $MINDMOTOR_REDIS_URL; none: in memory)")
    add(store, "--redis-url", help="the URL itself (discouraged when it holds a password: use $MINDMOTOR_REDIS_URL "
                                   "or the file)")
    add(store, "--redis-prefix", help="prefix of every Redis key (default: %(default)s)")

    health = parser.add_argument_group("health")
    add(health, "--heartbeat-interval", type=float, setting="heartbeat_interval_s",
        help="seconds between worker heartbeats (default: %(default)s)")
    add(health, "--suspect-misses", type=int,
        help="missed heartbeat intervals before an instance is suspect (default: %(default)s)")
    add(health, "--dead-after", type=float, setting="dead_after_s",
        help="seconds without a heartbeat before an instance is dead (default: %(default)s)")
    add(health, "--forget-after", type=float, setting="forget_after_s",
        help="seconds after which a dead instance's record is deleted (default: %(default)s)")
    add(health, "--lease-ttl", type=float, setting="lease_ttl_s",
        help="leader lease seconds; a standby takes over within twice this (default: %(default)s)")

    pd = parser.add_argument_group("prefill/decode ratio (see controller/pd_ratio.py)")
    add(pd, "--pd-autoscale", action="store_true",
        help="switch instance roles when measured TTFT/TPOT p90 miss the SLO (default: off)")
    add(pd, "--pd-ttft-slo-ms", type=float, help="default p90 time-to-first-token target, ms (default: %(default)s)")
    add(pd, "--pd-tpot-slo-ms", type=float, help="default p90 time-per-output-token target, ms (default: %(default)s)")
    add(pd, "--pd-slo", action="append", metavar="deployment=NAME,ttft_ms=N,tpot_ms=N",
        help="targets of one deployment (or model=NAME); repeatable")
    add(pd, "--pd-sustain", type=float, setting="pd_sustain_s",
        help="seconds a one-sided miss must last before a switch (default: %(default)s)")
    add(pd, "--pd-dwell", type=float, setting="pd_dwell_s",
        help="minimum seconds between two switches of one deployment (default: %(default)s)")
    add(pd, "--pd-headroom", type=float,
        help="the other side must be under this fraction of its target (default: %(default)s)")
    add(pd, "--pd-every", type=int, help="evaluate every this many heartbeat intervals (default: %(default)s)")


def config_from_args(args: argparse.Namespace):
    """The controller's settings: the flags given, then $MINDMOTOR_*, then the --config file.
    ValueError (pydantic's ValidationError) for inconsistent values, FileNotFoundError for a
    missing file."""
    return FLAGS.load(args)


def run_controller(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from mindmotor.common.logging import setup_logging
    from mindmotor.common.store import StoreUnavailable

    from mindmotor.common.settings import error_text

    setup_logging("controller", args.log_level or "INFO")
    log = logging.getLogger("mindmotor.controller")
    try:
        config = config_from_args(args)
    except (ValueError, OSError) as exc:             # bad settings (one line each), a missing file
        log.error("controller failed", extra={"error": error_text(exc, FLAGS.settings)})
        return 1
    setup_logging("controller", config.log_level)
    try:
        from mindmotor.common.rpc import configure_from_args

        configure_from_args(args)
        from .server import serve

        return asyncio.run(serve(config))
    except (ValueError, OSError, StoreUnavailable) as exc:   # bad TLS files, port in use, no Redis
        log.error("controller failed", extra={"error": f"{type(exc).__name__}: {exc}"})
        return 1
