"""Trainer commands for `mindmotor`:

    mindmotor train [--preset demo|quick|tiny] [--corpus PATH ...] [--out DIR] [--steps N] [--nproc N]
                    [--resume latest|promoted|VERSION] [--config FILE.json] [--set KEY=VALUE ...]
                    [--init-from DIR] [--tokenizer-from DIR]
    mindmotor trainer --port N [--store DIR] [--metrics-port M] [--config FILE.yaml]
    mindmotor debug compare --checkpoint DIR
    mindmotor checkpoints list|verify|promote|bundle ...

Nothing heavy is imported here (serving must not need PyTorch): each command imports what it
needs when it runs. `python -m mindmotor.trainer.cli ...` runs these commands alone.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from mindmotor.common.exposure import add_admin_arguments
from mindmotor.common.settings_flags import Flags, SettingsHelpFormatter

EXIT_BAD_CONFIG = 2


def register(subparsers) -> None:
    _register_train(subparsers)
    _register_trainer(subparsers)
    _register_debug(subparsers)
    _register_checkpoints(subparsers)


# ---- mindmotor train --------------------------------------------------------------------------
def _register_train(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a model locally (writes checkpoint versions)",
                              description="Train a Llama-architecture model; every checkpoint is "
                                          "a Hugging Face directory in the --out store.")
    p.add_argument("--preset", default="demo", help="base config: demo (default), quick (a servable model in minutes on a CPU) or tiny (tests)")
    p.add_argument("--config", type=Path, help="JSON file of config keys overriding the preset")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key (VALUE is JSON, else a string); repeatable")
    p.add_argument("--corpus", nargs="+", help="text/source files or directories "
                                               "(default: the Python standard library's sources)")
    p.add_argument("--steps", type=int, help="optimizer steps")
    p.add_argument("--seed", type=int)
    p.add_argument("--out", type=Path, default=Path("checkpoints"), help="checkpoint store directory")
    p.add_argument("--nproc", type=int, default=1, help="data-parallel processes on this machine")
    p.add_argument("--resume", help="continue from latest, promoted, a version name or a path")
    p.add_argument("--init-from", type=Path, metavar="DIR",
                   help="start from this Hugging Face checkpoint's weights (fine-tune): its config.json "
                        "sets the model's shape, its tokenizer is kept; a new run from step 0")
    p.add_argument("--tokenizer-from", type=Path, metavar="DIR",
                   help="use this checkpoint's tokenizer and chat template, byte for byte, instead of "
                        "training one (default: --init-from's)")
    p.add_argument("--lora-rank", type=int, help="train a LoRA adapter of this rank on --init-from's "
                   "weights (frozen) and write PEFT adapter directories instead of checkpoints")
    p.add_argument("--lora-alpha", type=float, help="LoRA scaling numerator (scale = alpha / rank; default 16)")
    p.add_argument("--lora-target-modules", nargs="+", metavar="MODULE",
                   help="linear layers to adapt (default: q_proj k_proj v_proj o_proj; also gate_proj up_proj down_proj)")
    p.add_argument("--run-name", help="versions are named <run-name>-step<N>")
    p.add_argument("--events", type=Path, help="also write progress events (JSON lines) here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)


def train_overrides(args) -> dict:
    overrides = json.loads(args.config.read_text()) if args.config else {}
    if not isinstance(overrides, dict):
        raise ValueError(f"{args.config}: a config file holds a JSON object")
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    for key in ("corpus", "steps", "seed", "lora_rank", "lora_alpha", "lora_target_modules"):
        if getattr(args, key, None) is not None:
            overrides[key] = getattr(args, key)
    return overrides


def cmd_train(args) -> int:
    from mindmotor.common.logging import setup_logging

    from .config import ConfigError
    from .validate import validated_config

    setup_logging("trainer")
    try:
        config = validated_config(args.preset, train_overrides(args), args.nproc, args.out,
                                  args.resume, init_from=_path(args.init_from),
                                  tokenizer_from=_path(args.tokenizer_from))
    except (ConfigError, ValueError, OSError) as exc:
        print(f"mindmotor train: error: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if not torch_installed():       # checked after the config, which needs no PyTorch (fast refusals)
        print(f"mindmotor train: error: {TORCH_MISSING}", file=sys.stderr)
        return EXIT_BAD_CONFIG

    from mindmotor.model.config import CheckpointError

    from .launch import exit_on_sigterm, run_training
    from .loop import RunOptions

    exit_on_sigterm()
    options = RunOptions(run_name=args.run_name, resume=args.resume, init_from=_path(args.init_from),
                         tokenizer_from=_path(args.tokenizer_from or args.init_from),
                         events_path=str(args.events) if args.events else None,
                         show_progress=not args.no_progress)
    try:
        run_training(config, args.out, options, nproc=args.nproc)
    except (ConfigError, CheckpointError) as exc:   # found once the corpus or checkpoint is read
        print(f"mindmotor train: error: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except KeyboardInterrupt:                        # Ctrl-C: the checkpoint (if any) is written
        return 128 + signal.SIGINT
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:    # a rank under torchrun
        from .distributed import exit_finished_rank

        exit_finished_rank()
    return 0


TORCH_MISSING = (f"training needs PyTorch, which is not installed here; install it with: "
                 f"{sys.executable} -m pip install 'torch==2.13.0' (as scripts/install.sh dev does)")


def torch_installed() -> bool:
    import importlib

    try:
        importlib.import_module("torch")
    except ImportError:
        return False
    return True


def _path(value: Path | None) -> str | None:
    return str(value.expanduser().resolve()) if value is not None else None


# ---- mindmotor trainer ------------------------------------------------------------------------
FLAGS = Flags("mindmotor.trainer.settings:TrainerSettings")


def _register_trainer(subparsers) -> None:
    p = subparsers.add_parser("trainer", help="serve the Trainer gRPC service (training jobs)",
                              formatter_class=SettingsHelpFormatter)
    FLAGS.add_config(p)
    FLAGS.add(p, "--port", type=int)
    FLAGS.add(p, "--host", help="address to listen on (default: %(default)s); beyond loopback it needs an admin token, "
                                "TLS or a cluster token")
    add_admin_arguments(p, "every Trainer call", FLAGS)
    FLAGS.add(p, "--store", type=Path, help="checkpoint store directory")
    FLAGS.add(p, "--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    from mindmotor.common.rpc_args import add_arguments as add_rpc_arguments

    add_rpc_arguments(p)
    p.set_defaults(func=cmd_trainer)


def cmd_trainer(args) -> int:
    import asyncio

    from mindmotor.common.logging import setup_logging
    from mindmotor.common.rpc import RpcSettingsError, configure_from_args
    from mindmotor.common.settings import error_text

    from .service import serve

    setup_logging("trainer")
    try:
        settings = FLAGS.load(args)
        configure_from_args(args)
    except (ValueError, OSError) as exc:       # bad settings (one line each), a missing file; RpcSettingsError too
        for line in error_text(exc, FLAGS.settings).splitlines():
            print(f"mindmotor trainer: error: {line}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if not settings.admin_token:
        import logging

        logging.getLogger("mindmotor.trainer").warning("the Trainer API is open: no admin token configured")
    try:
        asyncio.run(serve(settings.port, settings.store, host=settings.host, metrics_port=settings.metrics_port,
                          admin_token=settings.admin_token, allow_open=settings.allow_open_admin))
    except (RpcSettingsError, OSError) as exc:
        print(f"mindmotor trainer: error: {exc}", file=sys.stderr)
        return 1
    return 0


# ---- mindmotor debug compare ------------------------------------------------------------------
def _register_debug(subparsers) -> None:
    p = subparsers.add_parser("debug", help="debugging tools")
    debug = p.add_subparsers(dest="debug_command", metavar="TOOL", required=True)
    c = debug.add_parser("compare", help="PyTorch model vs the serving numpy model, per layer")
    c.add_argument("--checkpoint", type=Path, required=True)
    c.add_argument("--text", help="input text (default: a short Python function)")
    c.add_argument("--max-tokens", type=int, default=64)
    c.add_argument("--tolerance", type=float, default=1e-4,
                   help="exit 1 when the logits differ by more than this")
    c.set_defaults(func=cmd_compare)
    q = debug.add_parser("quality", help="validation loss of a checkpoint vs a unigram model, on the split it was trained with")
    q.add_argument("--checkpoint", type=Path, required=True)
    q.add_argument("--max-sequences", type=int, default=None, help="score at most this many val sequences")
    q.set_defaults(func=cmd_quality)


def cmd_quality(args) -> int:
    import json

    from mindmotor.model.config import CheckpointError

    from .baseline import evaluate_checkpoint

    try:
        report = evaluate_checkpoint(args.checkpoint, args.max_sequences)
    except (CheckpointError, ValueError) as exc:
        print(f"mindmotor debug quality: error: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    print(json.dumps(report.to_dict()))
    return 0


def cmd_compare(args) -> int:
    from mindmotor.model.config import CheckpointError

    from .compare import DEFAULT_TEXT, compare_checkpoint, format_table

    try:
        diffs = compare_checkpoint(args.checkpoint, args.text or DEFAULT_TEXT, args.max_tokens)
    except CheckpointError as exc:
        print(f"mindmotor debug compare: error: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    print(format_table(diffs))
    worst = diffs[-1].max_abs
    print(f"logits max |diff| {worst:.3e} ({'within' if worst <= args.tolerance else 'ABOVE'} "
          f"tolerance {args.tolerance:g})")
    return 0 if worst <= args.tolerance else 1


# ---- mindmotor checkpoints --------------------------------------------------------------------
def _register_checkpoints(subparsers) -> None:
    p = subparsers.add_parser("checkpoints", help="list, verify or promote checkpoint versions")
    p.add_argument("--store", type=Path, default=Path("checkpoints"))
    sub = p.add_subparsers(dest="checkpoints_command", metavar="ACTION", required=True)
    sub.add_parser("list", help="versions, oldest first").set_defaults(func=cmd_checkpoints_list)
    v = sub.add_parser("verify", help="check a checkpoint's files against its manifest")
    v.add_argument("ref", help="latest, promoted, a version name or a directory")
    v.set_defaults(func=cmd_checkpoints_verify)
    pr = sub.add_parser("promote", help="mark a version as the one to deploy")
    pr.add_argument("version")
    pr.set_defaults(func=cmd_checkpoints_promote)
    b = sub.add_parser("bundle", help="copy a version for serving only (no optimizer state)")
    b.add_argument("ref", help="latest, promoted, a version name or a directory")
    b.add_argument("destination", type=Path)
    b.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                   help="store the weights in this precision (default: as trained)")
    b.set_defaults(func=cmd_checkpoints_bundle)


def cmd_checkpoints_list(args) -> int:
    from .store import CheckpointStore

    store = CheckpointStore(args.store)
    promoted = store.promoted()
    for v in store.versions():
        mark = "*" if promoted and promoted.version == v.version else " "
        loss = f"{v.val_loss:.4f}" if v.val_loss is not None else "-"
        print(f"{mark} {v.version:40} step {v.step:>7}  val_loss {loss:>8}  parent {v.parent or '-'}")
    return 0


def cmd_checkpoints_verify(args) -> int:
    from mindmotor.model.config import CheckpointError

    from mindmotor.model.manifest import verify_checkpoint
    from .store import CheckpointStore

    try:
        path = CheckpointStore(args.store).resolve(args.ref)
        manifest = verify_checkpoint(path)
    except CheckpointError as exc:
        print(f"mindmotor checkpoints verify: error: {exc}", file=sys.stderr)
        return 1
    print(f"{path}: ok ({len(manifest['files'])} files match {path / 'mindmotor.json'})")
    return 0


def cmd_checkpoints_promote(args) -> int:
    from mindmotor.model.config import CheckpointError

    from .store import CheckpointStore

    try:
        found = CheckpointStore(args.store).promote(args.version)
    except CheckpointError as exc:
        print(f"mindmotor checkpoints promote: error: {exc}", file=sys.stderr)
        return 1
    print(f"promoted {found.version}")
    return 0


def cmd_checkpoints_bundle(args) -> int:
    from mindmotor.model.config import CheckpointError

    from .bundle import bundle_checkpoint
    from .store import CheckpointStore

    try:
        written = bundle_checkpoint(CheckpointStore(args.store).resolve(args.ref), args.destination,
                                    dtype=args.dtype)
    except CheckpointError as exc:
        print(f"mindmotor checkpoints bundle: error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {written}")
    return 0


# ---- running these commands alone -------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mindmotor")
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
