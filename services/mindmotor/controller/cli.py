"""`mindmotor controller`: the cluster's registry, health checks and routing table.

    MINDMOTOR_REDIS_URL=redis://:PASSWORD@127.0.0.1:6379/0 MINDMOTOR_ADMIN_TOKEN=... \\
    mindmotor controller --port 50050 --admin-port 8090
        [--pd-autoscale --pd-ttft-slo-ms 1000 --pd-tpot-slo-ms 50 --pd-slo deployment=NAME,ttft_ms=..,tpot_ms=..]

With `--port 0` (or `--admin-port 0`) a free port is picked; either way the controller prints
`MINDMOTOR_CONTROLLER_READY port=N admin_port=M` on stdout once it serves. Without a Redis URL
the registry lives in memory (one controller); with one, several controllers share it and one of
them (the lease holder) leads. Logs are JSON lines on stderr. Nothing heavy is imported until the
command runs.
"""

from __future__ import annotations

import argparse
import os

from mindmotor.common.exposure import DEFAULT_HOST, add_admin_arguments


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("controller", help="run the cluster controller (registry, health, routing)",
                                   description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.set_defaults(func=run_controller)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    net = parser.add_argument_group("serving")
    net.add_argument("--host", default=DEFAULT_HOST, help="gRPC address to listen on (default: %(default)s)")
    net.add_argument("--port", type=int, default=50050, help="gRPC port; 0 picks a free one (default: %(default)s)")
    net.add_argument("--admin-host", default=DEFAULT_HOST,
                     help="admin HTTP address (default: %(default)s); beyond loopback it needs an admin token")
    net.add_argument("--admin-port", type=int, default=8090,
                     help="admin HTTP port; 0 picks a free one (default: %(default)s)")
    add_admin_arguments(net, "every admin API call")
    from mindmotor.common.rpc_args import add_arguments as add_rpc_arguments

    add_rpc_arguments(parser)
    net.add_argument("--controller-id", default=None, help="name in logs, metrics and the lease (default: HOST-PID-RANDOM)")
    net.add_argument("--log-level", default="INFO", help="(default: %(default)s)")

    store = parser.add_argument_group("store")
    store.add_argument("--redis-url-file", default=None, metavar="FILE",
                       help="file holding the URL of the Redis for the registry and the leader lease "
                            "(default: $MINDMOTOR_REDIS_URL; none: in memory)")
    store.add_argument("--redis-url", default=None,
                       help="the URL itself (discouraged when it holds a password: use $MINDMOTOR_REDIS_URL "
                            "or the file)")
    store.add_argument("--redis-prefix", default=os.environ.get("MINDMOTOR_REDIS_PREFIX") or "mindmotor:",
                       help="prefix of every Redis key (default: %(default)s)")

    health = parser.add_argument_group("health")
    health.add_argument("--heartbeat-interval", type=float, default=1.0,
                        help="seconds between worker heartbeats (default: %(default)s)")
    health.add_argument("--suspect-misses", type=int, default=3,
                        help="missed heartbeat intervals before an instance is suspect (default: %(default)s)")
    health.add_argument("--dead-after", type=float, default=5.0,
                        help="seconds without a heartbeat before an instance is dead (default: %(default)s)")
    health.add_argument("--forget-after", type=float, default=60.0,
                        help="seconds after which a dead instance's record is deleted (default: %(default)s)")
    health.add_argument("--lease-ttl", type=float, default=2.0,
                        help="leader lease seconds; a standby takes over within twice this (default: %(default)s)")

    pd = parser.add_argument_group("prefill/decode ratio (see controller/pd_ratio.py)")
    pd.add_argument("--pd-autoscale", action="store_true",
                    help="switch instance roles when measured TTFT/TPOT p90 miss the SLO (default: off)")
    pd.add_argument("--pd-ttft-slo-ms", type=float, default=1000.0,
                    help="default p90 time-to-first-token target, ms (default: %(default)s)")
    pd.add_argument("--pd-tpot-slo-ms", type=float, default=50.0,
                    help="default p90 time-per-output-token target, ms (default: %(default)s)")
    pd.add_argument("--pd-slo", action="append", default=[], metavar="deployment=NAME,ttft_ms=N,tpot_ms=N",
                    help="targets of one deployment (or model=NAME); repeatable")
    pd.add_argument("--pd-sustain", type=float, default=30.0,
                    help="seconds a one-sided miss must last before a switch (default: %(default)s)")
    pd.add_argument("--pd-dwell", type=float, default=120.0,
                    help="minimum seconds between two switches of one deployment (default: %(default)s)")
    pd.add_argument("--pd-headroom", type=float, default=0.7,
                    help="the other side must be under this fraction of its target (default: %(default)s)")
    pd.add_argument("--pd-every", type=int, default=3,
                    help="evaluate every this many heartbeat intervals (default: %(default)s)")


def config_from_args(args: argparse.Namespace):
    """ValueError for inconsistent values."""
    from mindmotor.common.exposure import require_admin_token
    from mindmotor.common.secrets import ADMIN_TOKEN_ENV, REDIS_URL_ENV, secret

    from .config import ControllerConfig, default_controller_id

    admin_token = secret("admin token", args.admin_token, args.admin_token_file, ADMIN_TOKEN_ENV)
    redis_url = secret("Redis URL", args.redis_url, args.redis_url_file, REDIS_URL_ENV)
    require_admin_token("the controller admin API", args.admin_host, admin_token, args.allow_open_admin)
    return ControllerConfig(pd=pd_settings_from_args(args),
        host=args.host, port=args.port, admin_host=args.admin_host, admin_port=args.admin_port,
        admin_token=admin_token, redis_url=redis_url, redis_prefix=args.redis_prefix,
        heartbeat_interval_s=args.heartbeat_interval, suspect_misses=args.suspect_misses,
        dead_after_s=args.dead_after, forget_after_s=max(args.forget_after, args.dead_after),
        lease_ttl_s=args.lease_ttl, controller_id=args.controller_id or default_controller_id())


def pd_settings_from_args(args: argparse.Namespace):
    from .pd_ratio import RatioPolicyConfig
    from .pd_settings import PDAutoscaleSettings, make_slo, parse_slo

    default = make_slo(args.pd_ttft_slo_ms, args.pd_tpot_slo_ms)
    return PDAutoscaleSettings(
        enabled=args.pd_autoscale, default_slo=default, slos=dict(parse_slo(s, default) for s in args.pd_slo),
        policy=RatioPolicyConfig(headroom=args.pd_headroom, sustain_s=args.pd_sustain, dwell_s=args.pd_dwell),
        every_heartbeats=args.pd_every)


def run_controller(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from mindmotor.common.logging import setup_logging
    from mindmotor.common.store import StoreUnavailable

    setup_logging("controller", args.log_level)
    log = logging.getLogger("mindmotor.controller")
    try:
        config = config_from_args(args)
        from mindmotor.common.rpc import configure_from_args

        configure_from_args(args)
        from .server import serve

        return asyncio.run(serve(config))
    except (ValueError, OSError, StoreUnavailable) as exc:   # bad flags, port in use, no Redis
        log.error("controller failed", extra={"error": f"{type(exc).__name__}: {exc}"})
        return 1
