"""`mindmotor worker`: serve one model on one emulated NPU over gRPC.

    mindmotor worker --model DIR --port 50051 --device 910B3 --emulate qwen2-7b --timing realtime

With `--port 0` (or `--metrics-port 0`) a free port is picked; either way the worker prints
`MINDMOTOR_WORKER_READY port=N metrics_port=M` on stdout once it serves. Every flag has a
`MINDMOTOR_*` environment variable and a key in the `--config` YAML file (worker/config.py: the
engine's under `engine:`); flags win over the environment, which wins over the file. Logs are JSON lines on
stderr. Nothing heavy is imported until the command runs.
"""

from __future__ import annotations

import argparse

from mindmotor.common.roles import NAMES
from mindmotor.common.settings_flags import Flags, SettingsHelpFormatter

FLAGS = Flags("mindmotor.worker.config:WorkerConfig")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("worker", help="serve a model over gRPC on an emulated NPU",
                                   description=__doc__.splitlines()[0], formatter_class=SettingsHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run_worker)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = FLAGS.add
    FLAGS.add_config(parser)
    net = parser.add_argument_group("serving")
    add(net, "--host", help="address to listen on (default: %(default)s)")
    add(net, "--port", type=int, help="gRPC port; 0 picks a free one (default: %(default)s)")
    add(net, "--metrics-port", type=int, help="Prometheus /metrics port; 0 picks a free one (default: %(default)s)")
    add(net, "--worker-id",
        help="the instance id it registers with, in logs and Status (default: the name of its "
             "worker certificate under mutual TLS, else HOST-PID)")
    add(net, "--drain-timeout", type=float, setting="drain_timeout_s",
        help="seconds SIGTERM waits for in-flight requests (default: %(default)s)")
    add(net, "--max-concurrent-requests", type=int, metavar="N",
        help="Generate and Prefill calls served at once; one more is refused with "
             "RESOURCE_EXHAUSTED, so the coordinator tries another instance (default: %(default)s)")
    add(net, "--stream-keepalive", type=float, metavar="SECONDS", setting="stream_keepalive_s",
        help="a Generate stream that has sent nothing for this long gets a keepalive message "
             "(queued, a long prefill), so that the coordinator can tell a waiting worker from "
             "a frozen one; 0: never (default: %(default)s)")
    add(net, "--otlp-traces-endpoint", metavar="URL",
        help="export OpenTelemetry traces (each call with its queue, prefill and decode, KV transfers, "
             "under the caller's traceparent) over OTLP/HTTP to this receiver (vLLM's flag; needs the "
             "tracing extra; default: off)")
    add(net, "--inject-delay", metavar="PHASE=SECONDS",
        help="FOR TESTS ONLY: add SECONDS to every Generate call in PHASE — worker_queue (before the "
             "engine has the request) or network (after its last token, before the last message) — "
             "so that a latency analysis can be checked against a known cause (default: none)")
    add(net, "--engine-stall-timeout", type=float, metavar="SECONDS", setting="engine_stall_timeout_s",
        help="keepalives stop while the engine thread has not completed a step or an idle "
             "wait for this long, so the streams of a stuck engine go silent "
             "(default: %(default)s)")
    add(net, "--log-level", help="(default: %(default)s)")

    ctl = parser.add_argument_group("cluster")
    add(ctl, "--controller", metavar="HOST:PORT[,HOST:PORT]",
        help="register with this controller (or these, for failover) and heartbeat")
    add(ctl, "--advertise-address", metavar="HOST:PORT",
        help="the address the controller hands to coordinators (default: host:port)")
    add(ctl, "--served-model-name", metavar="NAME",
        help="the model name requests ask for: in Status, ModelInfo and the registration "
             "with the controller (default: the checkpoint directory's name)")
    add(ctl, "--deployment", help="deployment name (traffic splits)")
    add(ctl, "--version", help="deployment version, e.g. a checkpoint id")
    add(ctl, "--weight", type=int, help="routing weight (default: %(default)s)")

    pd = parser.add_argument_group("prefill/decode split")
    add(pd, "--role", choices=NAMES, help="what routers send here; changeable at run time (default: %(default)s)")
    add(pd, "--node",
        help="node name: KV moves over HCCS between workers of one node, else over the "
             "inter-node link (default: the host name)")
    add(pd, "--kv-pull-timeout", type=float, setting="kv_pull_timeout_s",
        help="decode side: seconds a KV pull may take before the prompt is computed "
             "here instead (default: %(default)s)")
    add(pd, "--kv-pin-timeout", type=float, setting="engine.kv_pin_ttl_s",
        help="prefill side: pinned KV is freed after this many seconds if no decode "
             "instance released it (default: %(default)s)")

    from mindmotor.common.rpc_args import add_arguments as add_rpc_arguments

    add_rpc_arguments(parser)

    eng = parser.add_argument_group("engine")
    add(eng, "--model", setting="engine.model", help="checkpoint directory (default: the bundled demo model)")
    add(eng, "--device", setting="engine.device", help="emulated device (default: %(default)s)")
    add(eng, "--emulate", metavar="PROFILE", setting="engine.emulate",
        help="emulated model profile, e.g. qwen2-7b, or a Hugging Face config.json "
             "(default: the served model's shape)")
    add(eng, "--tp", type=int, setting="engine.tensor_parallel",
        help="tensor parallel degree of the profile (default: 1)")
    add(eng, "--timing", choices=("realtime", "virtual"), setting="engine.timing",
        help="realtime: steps take the emulated time; virtual: no waiting (default: %(default)s)")
    add(eng, "--memory-fraction", type=float, setting="engine.memory_fraction", help="of HBM (default: %(default)s)")
    add(eng, "--block-size", type=int, setting="engine.block_size", help="tokens per KV block (default: %(default)s)")
    add(eng, "--num-blocks", type=int, setting="engine.num_blocks", help="KV pool size (default: from the device plan)")
    add(eng, "--max-num-seqs", type=int, setting="engine.max_num_seqs", help="(default: %(default)s)")
    add(eng, "--max-num-batched-tokens", type=int, setting="engine.max_num_batched_tokens",
        help="tokens one step computes, decodes and prefill chunks together (default: %(default)s)")
    add(eng, "--long-prefill-token-threshold", type=int, metavar="N", setting="engine.long_prefill_token_threshold",
        help="new tokens of one prompt per step, with chunked prefill; 0: no cap beyond "
             "the step's budgets (default: %(default)s)")
    add(eng, "--max-num-partial-prefills", type=int, metavar="N", setting="engine.max_num_partial_prefills",
        help="prompts part-way through a chunked prefill at once; one that would start "
             "another waits, shorter ones that fit whole go first (default: %(default)s)")
    add(eng, "--max-num-batched-attention", type=_attention, metavar="PAIRS|auto",
        setting="engine.max_num_batched_attention",
        help="query-key pairs of prefill attention one step computes (a chunk of c tokens "
             "after p computed ones: c*p + c*(c+1)/2), so that a long prompt holds back other "
             "requests' tokens for one bounded step; auto: about 30 ms of the served model's "
             "attention on the host (131072 for the bundled model); 0: no limit (default: auto)")
    add(eng, "--priority-aging-s", type=float, metavar="SECONDS", setting="engine.priority_aging_s",
        help="SLO classes: a class (a request priority) whose waiting requests have not had one "
             "start for this long has its oldest one go ahead of every other request, so no "
             "class waits longer than this plus one step for a start; 0: no aging (default: %(default)s)")
    add(eng, "--lower-class-prefill-tokens", type=int, metavar="N", setting="engine.lower_class_prefill_tokens",
        help="SLO classes: prefill tokens per step of less urgent prompts beside more urgent work "
             "(always, for priorities above 0: the batch class); a step that starts a more urgent "
             "prompt defers their decodes to the next; 0: off (default: %(default)s)")
    add(eng, "--preferred-batch-size", type=int, metavar="N", setting="engine.preferred_batch_size",
        help="with --batch-timeout-s: an idle engine waits for this many waiting requests "
             "(Triton's dynamic_batching preferred_batch_size; 0: --max-num-seqs) (default: %(default)s)")
    add(eng, "--batch-timeout-s", type=float, metavar="SECONDS", setting="engine.batch_timeout_s",
        help="an idle engine with fewer than --preferred-batch-size waiting requests waits up to "
             "this long after the oldest arrived before its first step (Triton's "
             "max_queue_delay_microseconds / 1e6); 0: never waits (default: %(default)s)")
    add(eng, "--max-model-len", type=int, setting="engine.max_model_len", help="(default: the model's context)")
    add(eng, "--kv-host-budget", type=_size, metavar="SIZE", setting="engine.kv_host_budget_bytes",
        help="host memory for KV arrays, e.g. 2GiB, 512MiB or 25%% (of the machine's); past it "
             "cached prefix blocks are evicted; it must hold one --max-model-len sequence "
             "(default: 10%% of the machine's memory)")
    add(eng, "--kv-host-bytes", type=_size, metavar="SIZE", setting="engine.kv_host_bytes",
        help="the KV host tier: prefix-cache blocks evicted from the emulated card's HBM are kept "
             "in this much host memory and loaded back over the host link instead of recomputed, "
             "e.g. 8GiB or 5%% (of the machine's); 0: no tier (default: 5%% of the machine's memory)")
    add(eng, "--cache-chunk-size", type=_size, metavar="SIZE", setting="engine.cache_chunk_size",
        help="KV per host-tier chunk, the unit of its copies and LRU eviction, in the emulated "
             "card's bytes (default: 256MiB)")
    add(eng, "--prefetch-depth", type=_positive, metavar="N", setting="engine.prefetch_depth",
        help="host-tier chunk copies in flight at once (default: %(default)s)")
    add(eng, "--kv-shared", action="store_true",
        help="share the KV host tier's blocks with the model's other workers through Redis "
             "($MINDMOTOR_REDIS_URL or --redis-url-file), so a conversation that lands elsewhere "
             "still finds its prefix (default: off)")
    add(eng, "--kv-shared-ttl", type=float, metavar="S", setting="kv_shared_ttl_s",
        help="seconds a shared block lives in Redis (default: %(default)s)")
    add(eng, "--redis-url-file", metavar="FILE",
        help="a file holding the shared KV tier's Redis URL (also: $MINDMOTOR_REDIS_URL)")
    add(eng, "--no-prefix-caching", action="store_true", setting="engine.enable_prefix_caching",
        convert=lambda given: not given, help="disable prefix caching")
    add(eng, "--no-chunked-prefill", action="store_true", setting="engine.enable_chunked_prefill",
        convert=lambda given: not given, help="disable chunked prefill")
    add(eng, "--seed", type=int, setting="engine.seed", help="seeds the requests that bring no seed (a reproducible worker); default: fresh OS "
                                                                   "entropy per request, as vLLM samples unseeded requests")

    lora = parser.add_argument_group("LoRA adapters (vLLM's flags)")
    add(lora, "--enable-lora", action="store_true", setting="engine.enable_lora",
        help="serve PEFT LoRA adapters on the base model (requests select one with model: <adapter>)")
    add(lora, "--lora-modules", nargs="+", metavar="NAME=PATH", setting="engine.lora_modules", convert=lora_modules,
        help="adapters served from the start, each NAME=PATH (a PEFT adapter directory); needs --enable-lora")
    add(lora, "--max-loras", type=int, setting="engine.max_loras",
        help="adapters in device slots at once: one step's batch mixes at most this many (default: %(default)s)")
    add(lora, "--max-lora-rank", type=int, setting="engine.max_lora_rank",
        help="adapters of a higher rank are refused (default: %(default)s)")
    add(lora, "--max-cpu-loras", type=int, setting="engine.max_cpu_loras",
        help="adapters kept loaded in host memory, least recently used dropped first (default: --max-loras)")
    add(eng, "--resume-retention", type=float, metavar="S", setting="resume_retention_s",
        help="seconds a request's output tokens are kept after it ended, so that another coordinator "
             "can resume its client's stream (Recall); 0: not kept (default: %(default)s)")
    add(eng, "--spec-helpers", type=int,
        help="helper processes that compile structured-output specs before the engine does, "
             "so that a spec that crashes the compiler costs a helper, not the worker (default: 1)")
    add(eng, "--spec-timeout", type=float, setting="spec_timeout_s",
        help="seconds one spec may take to compile in a helper; longer is INVALID_ARGUMENT "
             "(default: %(default)s)")


def lora_modules(items: list[str]) -> tuple[tuple[str, str], ...]:
    """`--lora-modules a=/p/a b=/p/b` (also one argument "a=/p/a b=/p/b" or "a=/p/a,b=/p/b", as a
    deployment spec's single value carries it) → (("a", "/p/a"), ("b", "/p/b"))."""
    pairs = []
    for item in items:
        for part in item.replace(",", " ").split():
            name, sep, path = part.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"--lora-modules: expected NAME=PATH, got {part!r}")
            pairs.append((name, path))
    return tuple(pairs)


def _attention(text: str) -> int | str:
    """`--max-num-batched-attention`: a number of query-key pairs, or "auto" (from the served model)."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of query-key pairs or 'auto', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0 (0: no limit), got {value}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _size(text: str) -> int:
    """`--kv-host-budget`, `--kv-host-bytes`, `--cache-chunk-size`: a size in bytes ("2GiB", "25%", ...)."""
    from mindmotor.engine.host_memory import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def config_from_args(args: argparse.Namespace):
    """The worker's settings: the flags given, then $MINDMOTOR_*, then the --config file.
    ValueError (pydantic's ValidationError) for inconsistent values, FileNotFoundError for a
    missing file."""
    return FLAGS.load(args)


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
    from mindmotor.common.settings import error_text

    setup_logging("worker", args.log_level or "INFO")
    log = logging.getLogger("mindmotor.worker")
    try:
        config = config_from_args(args)
    except (ValueError, OSError) as exc:              # bad settings (one line each), a missing file
        log.error("worker failed", extra={"error": error_text(exc, FLAGS.settings)})
        return 1
    setup_logging("worker", config.log_level)
    try:
        from mindmotor.common.rpc import configure_from_args

        sec = configure_from_args(args)
        config = config.model_copy(update={"worker_id": worker_id_for(config.given_worker_id(), sec.cert)})
        from .server import serve

        return asyncio.run(serve(config))
    except (ValueError, OSError, MemoryError, RuntimeError) as exc:   # bad flags, model, port, HBM
        log.error("worker failed", extra={"error": f"{type(exc).__name__}: {exc}"})
        return 1
