"""`mindmotor coordinator`: the OpenAI-compatible HTTP front door.

    mindmotor coordinator --port 8000 --worker 10.0.0.5:50051 --worker 10.0.0.6:50051,weight=2 \\
        --policy least_load --api-key-file /run/secrets/api-keys \\
        --https-cert tls.crt --https-key tls.key
    mindmotor coordinator --port 8000 --controller 10.0.0.2:50050 --model qwen2-7b=/ckpt/qwen2-7b

The models served are those of the workers: a model without `--model` (or `--model-dir`) is
discovered from its workers (tokenizer and chat template through their `ModelInfo`).

With `--port 0` a free port is picked; either way it prints `MINDMOTOR_COORDINATOR_READY port=N`
on stdout once it serves. Every flag has a `MINDMOTOR_*` environment variable and a YAML key
(`--config`); flags win over the environment, which wins over the file. Logs are JSON lines on
stderr. Nothing heavy is imported until the command runs.
"""

from __future__ import annotations

import argparse

POLICIES = ("round_robin", "weighted_round_robin", "least_load", "cache_aware")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("coordinator", help="serve the OpenAI-compatible HTTP API",
                                   description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.set_defaults(func=run_coordinator)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--config", default=None, metavar="FILE.yaml", help="settings file (YAML; keys as in CoordinatorSettings)")
    add("--host", default=None, help="address to listen on (default: 127.0.0.1)")
    add("--port", type=int, default=None, help="HTTP port; 0 picks a free one (default: 8000)")
    add("--fd", type=int, default=None, metavar="FD",
        help="serve the listening socket inherited as this file descriptor instead of binding --port "
             "(how `mindmotor up` runs several replicas behind one port)")
    add("--replica-port", type=int, default=None, metavar="PORT",
        help="also serve on this port of --host, this process alone (probes, per-replica /health); 0: a free one")
    add("--coordinator-id", default=None, help="this coordinator's name in reports to the controller")
    add("--replicas", type=int, default=1, metavar="N",
        help="run N coordinator processes behind --port, supervised (a replica that dies refuses no connection and "
             "is started again; a cut stream resumes on another; /metrics sums them) (default: 1)")
    add("--controller", action="append", default=None, metavar="ADDR",
        help="a controller's gRPC address (repeatable): instances from its routing table, not --worker")
    add("--worker", action="append", default=None, metavar="ADDR[,weight=W,version=V,deployment=D]",
        help="a worker's gRPC address (repeatable)")
    add("--model", action="append", default=None, metavar="NAME=DIR",
        help="served model name and the checkpoint directory of its tokenizer and chat template "
             "(repeatable; optional: a model without one is discovered from its workers)")
    add("--model-dir", default=None, metavar="DIR",
        help="checkpoint directory (tokenizer, chat template) for every model without --model "
             "(then no model is discovered)")
    add("--policy", default=None, choices=POLICIES, help="routing policy (default: least_load)")
    add("--api-key-file", default=None, metavar="FILE",
        help="accepted API keys, one a line (also: $MINDMOTOR_API_KEYS, comma-separated)")
    add("--api-key", action="append", default=None, metavar="KEY",
        help="an accepted API key (repeatable; discouraged: visible in the process list)")
    add("--https-cert", default=None, metavar="FILE", help="serve HTTPS: PEM certificate (chain)")
    add("--https-key", default=None, metavar="FILE", help="serve HTTPS: the certificate's PEM private key")
    add("--rate-limit-rpm", type=float, default=None, help="requests per minute per key (default: unlimited)")
    add("--redis-url-file", default=None, metavar="FILE",
        help="share the rate limit through the Redis whose URL this file holds (also: $MINDMOTOR_REDIS_URL)")
    add("--redis-url", default=None, help="the Redis URL itself (discouraged when it holds a password)")
    add("--max-requests", type=int, default=None, help="outstanding requests per model (default: 10000)")
    add("--max-retry", type=int, default=None, help="resubmissions after worker failures (default: 5)")
    add("--max-body-bytes", type=int, default=None, help="request body limit (default: 1 MiB)")
    add("--max-tools", type=int, default=None, help="functions in one request's tools (default: 128)")
    add("--spec-helpers", type=int, default=None,
        help="helper processes that compile structured-output specs, off the event loop (default: 2)")
    add("--spec-timeout", type=float, default=None, metavar="S",
        help="seconds a spec may take to compile; longer: 400 (default: 3)")
    add("--stream-progress-timeout", type=float, default=None, metavar="S",
        help="a worker stream that sends nothing (no token, no keepalive) for this long is given up and "
             "continued on another worker; 0: never (default: 5)")
    add("--http-header-timeout", type=float, default=None, metavar="S",
        help="seconds a client has to send the request line and headers (default: 10)")
    add("--http-body-timeout", type=float, default=None, metavar="S",
        help="seconds a client has to send the body after the headers (default: 60)")
    add("--http-keep-alive", type=float, default=None, metavar="S", help="idle keep-alive timeout (default: 30)")
    add("--http-max-connections", type=int, default=None, metavar="N",
        help="open HTTP connections; beyond, 503 + Retry-After; 0: no limit (default: 4096)")
    add("--http-protocol", choices=("auto", "h11", "httptools"), default=None,
        help="uvicorn's HTTP/1.1 parser (default: auto: httptools where installed, else h11)")
    add("--event-loop", choices=("auto", "asyncio", "uvloop"), default=None,
        help="the asyncio event loop (default: auto: uvloop where installed, else asyncio's)")
    add("--access-log", action="store_true", default=None,
        help="log an INFO line per API request (default: off; every request is logged at DEBUG)")
    add("--access-log-sample", type=float, default=None, metavar="FRACTION",
        help="with --access-log: log this share of the requests, e.g. 0.01 (default: 1; 5xx always)")
    add("--allowed-origin", action="append", default=None, metavar="ORIGIN",
        help="CORS: an origin browsers may call from (repeatable; '*' for any; default: CORS off)")
    add("--otlp-traces-endpoint", default=None, metavar="URL",
        help="export OpenTelemetry traces over OTLP/HTTP to this receiver, e.g. http://127.0.0.1:4318 "
             "(vLLM's flag; needs the tracing extra; default: off)")
    add("--log-level", default=None, help="(default: INFO)")
    from mindmotor.common.rpc_args import add_arguments as add_rpc_arguments

    add_rpc_arguments(parser)           # the coordinator's channels to controllers and workers


def settings_from_args(args: argparse.Namespace):
    from mindmotor.coordinator.config import WorkerEntry, load_settings

    models = None
    if args.model:
        models = {}
        for item in args.model:
            name, sep, directory = item.partition("=")
            if not sep or not name or not directory:
                raise ValueError(f"--model takes NAME=DIR, got {item!r}")
            models[name] = directory
    overrides = dict(
        host=args.host, port=args.port, listen_fd=args.fd, replica_port=args.replica_port,
        coordinator_id=args.coordinator_id, max_tools=args.max_tools, spec_helpers=args.spec_helpers,
        spec_timeout_s=args.spec_timeout, models=models, model_dir=args.model_dir, policy=args.policy,
        api_keys=args.api_key, api_key_file=args.api_key_file, rate_limit_rpm=args.rate_limit_rpm,
        redis_url=args.redis_url, redis_url_file=args.redis_url_file, https_cert=args.https_cert,
        https_key=args.https_key,
        max_requests=args.max_requests, max_retry=args.max_retry, max_body_bytes=args.max_body_bytes,
        stream_progress_timeout_s=args.stream_progress_timeout,
        log_level=args.log_level, controllers=args.controller,
        http_header_timeout_s=args.http_header_timeout, http_body_timeout_s=args.http_body_timeout,
        http_keep_alive_s=args.http_keep_alive, http_max_connections=args.http_max_connections,
        http_protocol=args.http_protocol, event_loop=args.event_loop, access_log=args.access_log,
        access_log_sample=args.access_log_sample,
        cors_allowed_origins=args.allowed_origin, otlp_traces_endpoint=args.otlp_traces_endpoint,
        workers=[WorkerEntry.parse(w) for w in args.worker] if args.worker else None)
    return load_settings(args.config, **overrides)


def run_coordinator(args: argparse.Namespace) -> int:
    import logging

    from pydantic import ValidationError

    from mindmotor.common.logging import setup_logging

    setup_logging("coordinator", args.log_level or "INFO")
    log = logging.getLogger("mindmotor.coordinator")
    try:
        settings = settings_from_args(args)
        from mindmotor.common.rpc import configure_from_args

        configure_from_args(args)
    except (ValueError, ValidationError, FileNotFoundError) as exc:
        from mindmotor.common.settings import error_text

        from .config import CoordinatorSettings

        log.error("bad coordinator settings", extra={"error": error_text(exc, CoordinatorSettings)})
        return 2
    setup_logging("coordinator", settings.log_level)
    if settings.listen_fd is None:              # under `up` (a socket handed over) up warns itself, once
        from mindmotor.common.exposure import open_api_warning

        if warning := open_api_warning(settings.host, bool(settings.api_keys or settings.api_key_file)):
            log.warning(warning)
    if args.replicas > 1:
        from mindmotor.coordinator.http.replicas import run_from_cli

        return run_from_cli(settings, args.replicas)
    from mindmotor.coordinator.http.server import serve

    from mindmotor.common.event_loop import run

    try:
        return run(serve(settings), settings.event_loop)
    except OSError as exc:  # the port is taken, ...
        log.error("coordinator failed", extra={"error": f"{type(exc).__name__}: {exc}"})
        return 1
