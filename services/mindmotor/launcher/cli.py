"""`mindmotor up [--port 8000] [--config FILE]`: the whole platform on this machine.

Its settings (launcher/config.py) come from the flags, then `MINDMOTOR_*` environment variables,
then the `--config` YAML file."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("up", help="start controller, deployer (and its workers) and coordinator, supervised",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, metavar="FILE.yaml",
                        help="platform settings (see mindmotor/launcher/config.py)")
    parser.add_argument("--host", default=None, help="where every service listens (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="the API port (default: 8000; 0: free)")
    parser.add_argument("--workers", type=int, default=None, help="workers for the (first) model (default: 2)")
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the bundled demo)")
    parser.add_argument("--model-repository", default=None, metavar="DIR",
                        help="serve the models of a Triton model repository: DIR/<name>/config.pbtxt with "
                             'platform: "mindmotor_llm" (max_batch_size, dynamic_batching, parameters '
                             "{ checkpoint }; docs/operations.md); instead of --model and the config's models")
    parser.add_argument("--timing", choices=("realtime", "virtual"), default=None)
    parser.add_argument("--api-key-file", default=None, metavar="FILE",
                        help="the API keys the coordinators accept, one a line (also: $MINDMOTOR_API_KEYS, "
                             "comma-separated); without keys the API is open")
    parser.add_argument("--state-dir", default=None, metavar="DIR",
                        help="PKI, deployments, ports and logs, kept across restarts and locked while this runs "
                             "(also: $MINDMOTOR_STATE_DIR, `state_dir:`; default: $XDG_DATA_HOME/mindmotor, "
                             "i.e. ~/.local/share/mindmotor)")
    parser.add_argument("--log-dir", default=None, metavar="DIR", help="the services' logs (default: STATE_DIR/logs)")
    lora = parser.add_argument_group("LoRA adapters of the (first) model's workers (as `mindmotor worker`'s)")
    lora.add_argument("--enable-lora", action="store_true", default=None)
    lora.add_argument("--lora-modules", nargs="+", metavar="NAME=PATH", default=None)
    lora.add_argument("--max-loras", type=int, default=None)
    lora.add_argument("--max-lora-rank", type=int, default=None)
    lora.add_argument("--max-cpu-loras", type=int, default=None)
    parser.add_argument("--log-level", default="INFO")
    parser.set_defaults(func=run_up)


def lora_flags(args: argparse.Namespace) -> list[str]:
    """The LoRA flags given to `up`, as the first model's worker flags (extra_args)."""
    flags = ["--enable-lora"] if args.enable_lora else []
    if args.lora_modules:
        flags += ["--lora-modules", ",".join(args.lora_modules)]
    for flag, value in (("--max-loras", args.max_loras), ("--max-lora-rank", args.max_lora_rank),
                        ("--max-cpu-loras", args.max_cpu_loras)):
        if value is not None:
            flags += [flag, str(value)]
    return flags


def run_up(args: argparse.Namespace) -> int:
    import logging

    from pydantic import ValidationError

    from mindmotor.common.logging import setup_logging

    from mindmotor.common.settings import error_text

    from .config import ModelSpec, PlatformConfig
    from .up import run

    setup_logging("up", args.log_level)
    try:
        if args.model_repository is not None and args.model is not None:
            raise ValueError("give either --model or --model-repository, not both")
        config = PlatformConfig.load(args.config, host=args.host, port=args.port, api_key_file=args.api_key_file,
                                     state_dir=args.state_dir, log_dir=args.log_dir,
                                     model_repository=args.model_repository)
        changes = {k: v for k, v in {"workers": args.workers, "path": args.model,
                                     "timing": args.timing}.items() if v is not None}
        lora_args = lora_flags(args)
        if lora_args:
            changes["extra_args"] = [*config.models[0].extra_args, *lora_args]
        if changes:                                    # the first model's, checked again
            config.models[0] = ModelSpec.model_validate({**config.models[0].model_dump(), **changes})
    except (ValidationError, ValueError, OSError) as exc:   # one line per bad setting
        logging.getLogger("mindmotor.up").error("bad platform config", extra={"error": error_text(exc, PlatformConfig)})
        return 2
    return run(config)
