"""`mindmotor worker`: serve one model on one emulated NPU over gRPC.

    mindmotor worker --model DIR --port 50051 --device 910B3 --emulate qwen2-7b --timing realtime

With `--port 0` (or `--metrics-port 0`) a free port is picked; either way the worker prints
`MINDMOTOR_WORKER_READY port=N metrics_port=M` on stdout once it serves. Logs are JSON lines on
stderr. Nothing heavy is imported until the command runs.
"""

from __future__ import annotations

import argparse

from mindmotor.common.roles import NAMES, Role


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("worker", help="serve a model over gRPC on an emulated NPU",
                                   description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.set_defaults(func=run_worker)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    net = parser.add_argument_group("serving")
    net.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    net.add_argument("--port", type=int, default=50051, help="gRPC port; 0 picks a free one (default: %(default)s)")
    net.add_argument("--metrics-port", type=int, default=0,
                     help="Prometheus /metrics port; 0 picks a free one (default: %(default)s)")
    net.add_argument("--worker-id", default=None,
                     help="the instance id it registers with, in logs and Status (default: the name of its "
                          "worker certificate under mutual TLS, else HOST-PID)")
    net.add_argument("--drain-timeout", type=float, default=30.0,
                     help="seconds SIGTERM waits for in-flight requests (default: %(default)s)")
    net.add_argument("--max-concurrent-requests", type=int, default=4096, metavar="N",
                     help="Generate and Prefill calls served at once; one more is refused with "
                          "RESOURCE_EXHAUSTED, so the coordinator tries another instance (default: %(default)s)")
    net.add_argument("--stream-keepalive", type=float, default=1.0, metavar="SECONDS",
                     help="a Generate stream that has sent nothing for this long gets a keepalive message "
                          "(queued, a long prefill), so that the coordinator can tell a waiting worker from "
                          "a frozen one; 0: never (default: %(default)s)")
    net.add_argument("--engine-stall-timeout", type=float, default=10.0, metavar="SECONDS",
                     help="keepalives stop while the engine thread has not completed a step or an idle "
                          "wait for this long, so the streams of a stuck engine go silent "
                          "(default: %(default)s)")
    net.add_argument("--log-level", default="INFO", help="(default: %(default)s)")

    ctl = parser.add_argument_group("cluster")
    ctl.add_argument("--controller", default=None, metavar="HOST:PORT[,HOST:PORT]",
                     help="register with this controller (or these, for failover) and heartbeat")
    ctl.add_argument("--advertise-address", default=None, metavar="HOST:PORT",
                     help="the address the controller hands to coordinators (default: host:port)")
    ctl.add_argument("--served-model-name", default=None, metavar="NAME",
                     help="the model name requests ask for: in Status, ModelInfo and the registration "
                          "with the controller (default: the checkpoint directory's name)")
    ctl.add_argument("--deployment", default="", help="deployment name (traffic splits)")
    ctl.add_argument("--version", default="", help="deployment version, e.g. a checkpoint id")
    ctl.add_argument("--weight", type=int, default=1, help="routing weight (default: %(default)s)")

    pd = parser.add_argument_group("prefill/decode split")
    pd.add_argument("--role", choices=NAMES, default=Role.MIXED.value,
                    help="what routers send here; changeable at run time (default: %(default)s)")
    pd.add_argument("--node", default=None,
                    help="node name: KV moves over HCCS between workers of one node, else over the "
                         "inter-node link (default: the host name)")
    pd.add_argument("--kv-pull-timeout", type=float, default=5.0,
                    help="decode side: seconds a KV pull may take before the prompt is computed "
                         "here instead (default: %(default)s)")
    pd.add_argument("--kv-pin-timeout", type=float, default=30.0,
                    help="prefill side: pinned KV is freed after this many seconds if no decode "
                         "instance released it (default: %(default)s)")

    from mindmotor.common.rpc_args import add_arguments as add_rpc_arguments

    add_rpc_arguments(parser)

    eng = parser.add_argument_group("engine")
    eng.add_argument("--model", default=None, help="checkpoint directory (default: the bundled demo model)")
    eng.add_argument("--device", default="910B3", help="emulated device (default: %(default)s)")
    eng.add_argument("--emulate", default=None, metavar="PROFILE",
                     help="emulated model profile, e.g. qwen2-7b, or a Hugging Face config.json "
                          "(default: the served model's shape)")
    eng.add_argument("--tp", type=int, default=1, help="tensor parallel degree of the profile (default: 1)")
    eng.add_argument("--timing", choices=("realtime", "virtual"), default="realtime",
                     help="realtime: steps take the emulated time; virtual: no waiting (default: %(default)s)")
    eng.add_argument("--memory-fraction", type=float, default=0.8, help="of HBM (default: %(default)s)")
    eng.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default: %(default)s)")
    eng.add_argument("--num-blocks", type=int, default=None, help="KV pool size (default: from the device plan)")
    eng.add_argument("--max-num-seqs", type=int, default=256, help="(default: %(default)s)")
    eng.add_argument("--max-num-batched-tokens", type=int, default=8192,
                     help="tokens one step computes, decodes and prefill chunks together (default: %(default)s)")
    eng.add_argument("--long-prefill-token-threshold", type=int, default=0, metavar="N",
                     help="new tokens of one prompt per step, with chunked prefill; 0: no cap beyond "
                          "the step's budgets (default: %(default)s)")
    eng.add_argument("--max-num-partial-prefills", type=int, default=1, metavar="N",
                     help="prompts part-way through a chunked prefill at once; one that would start "
                          "another waits, shorter ones that fit whole go first (default: %(default)s)")
    eng.add_argument("--max-num-batched-attention", type=_attention, default=None, metavar="PAIRS|auto",
                     help="query-key pairs of prefill attention one step computes (a chunk of c tokens "
                          "after p computed ones: c*p + c*(c+1)/2), so that a long prompt holds back other "
                          "requests' tokens for one bounded step; auto: about 30 ms of the served model's "
                          "attention on the host (131072 for the bundled model); 0: no limit (default: auto)")
    eng.add_argument("--max-model-len", type=int, default=None, help="(default: the model's context)")
    eng.add_argument("--kv-host-budget", type=_size, default=None, metavar="SIZE",
                     help="host memory for KV arrays, e.g. 2GiB, 512MiB or 25%% (of the machine's); past it "
                          "cached prefix blocks are evicted; it must hold one --max-model-len sequence "
                          "(default: 10%% of the machine's memory)")
    eng.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    eng.add_argument("--no-chunked-prefill", action="store_true", help="disable chunked prefill")
    eng.add_argument("--seed", type=int, default=0, help="for requests without a seed (default: 0)")
    eng.add_argument("--resume-retention", type=float, default=60.0, metavar="S",
                     help="seconds a request's output tokens are kept after it ended, so that another coordinator "
                          "can resume its client's stream (Recall); 0: not kept (default: %(default)s)")
    eng.add_argument("--spec-helpers", type=int, default=1,
                     help="helper processes that compile structured-output specs before the engine does, "
                          "so that a spec that crashes the compiler costs a helper, not the worker (default: 1)")
    eng.add_argument("--spec-timeout", type=float, default=3.0,
                     help="seconds one spec may take to compile in a helper; longer is INVALID_ARGUMENT "
                          "(default: %(default)s)")


def _attention(text: str) -> int | None:
    """`--max-num-batched-attention`: a number of query-key pairs, or "auto" (None)."""
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of query-key pairs or 'auto', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0 (0: no limit), got {value}")
    return value


def _size(text: str) -> int:
    """`--kv-host-budget`: a size in bytes ("2GiB", "25%", ...)."""
    from mindmotor.engine.host_memory import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def config_from_args(args: argparse.Namespace):
    """ValueError for inconsistent values."""
    from mindmotor.engine.config import EngineConfig

    from .config import WorkerConfig, default_worker_id

    engine = EngineConfig(
        model=args.model, device=args.device, emulate=args.emulate, tensor_parallel=args.tp,
        timing=args.timing, memory_fraction=args.memory_fraction, block_size=args.block_size,
        num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        max_num_partial_prefills=args.max_num_partial_prefills,
        max_num_batched_attention=args.max_num_batched_attention,
        enable_prefix_caching=not args.no_prefix_caching,
        enable_chunked_prefill=not args.no_chunked_prefill, seed=args.seed, kv_pin_ttl_s=args.kv_pin_timeout,
        kv_host_budget_bytes=args.kv_host_budget)
    return WorkerConfig(engine=engine, host=args.host, port=args.port, metrics_port=args.metrics_port,
                        worker_id=args.worker_id or default_worker_id(), drain_timeout_s=args.drain_timeout,
                        controller=args.controller, advertise_address=args.advertise_address,
                        served_model_name=args.served_model_name, deployment=args.deployment,
                        version=args.version, weight=args.weight,
                        role=args.role, kv_pull_timeout_s=args.kv_pull_timeout,
                        max_concurrent_requests=args.max_concurrent_requests,
                        spec_helpers=args.spec_helpers, spec_timeout_s=args.spec_timeout,
                        resume_retention_s=args.resume_retention,
                        stream_keepalive_s=args.stream_keepalive, engine_stall_timeout_s=args.engine_stall_timeout,
                        **({"node": args.node} if args.node else {}))


def worker_id_for(given: str | None, cert_pem: bytes | None) -> str:
    """The id the worker registers with. Under mutual TLS with a worker certificate it is the
    certificate's name (`mindmotor://worker/NAME`: the controller lets a worker act on its own
    instance only), so `--worker-id` may be left out, and must match if given (ValueError)."""
    from mindmotor.common.certs import identity_of

    from .config import default_worker_id

    identity = identity_of(cert_pem) if cert_pem else None
    if identity is None or identity.role != "worker":
        return given or default_worker_id()
    if given and given != identity.name:
        raise ValueError(f"--worker-id {given} is not this worker's certificate name ({identity.name}): the "
                         f"controller accepts a worker's registration only under its certificate's name")
    return identity.name


def run_worker(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from mindmotor.common.logging import setup_logging

    setup_logging("worker", args.log_level)
    log = logging.getLogger("mindmotor.worker")
    try:
        from dataclasses import replace

        from mindmotor.common.rpc import configure_from_args

        sec = configure_from_args(args)
        config = replace(config_from_args(args), worker_id=worker_id_for(args.worker_id, sec.cert))
        from .server import serve

        return asyncio.run(serve(config))
    except (ValueError, OSError, MemoryError, RuntimeError) as exc:   # bad flags, model, port, HBM
        log.error("worker failed", extra={"error": f"{type(exc).__name__}: {exc}"})
        return 1
