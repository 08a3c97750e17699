"""`mindmotor` — one command for the platform.

Each area registers its own subcommands from `mindmotor/<area>/cli.py` with a `register(subparsers)`
function; that module must import nothing heavy at import time (the trainer's PyTorch, for one, is
imported only when a training command runs).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from mindmotor.common.logging import LOG_FORMAT_ENV, LOG_FORMATS

# Modules that contribute subcommands. A module that does not exist yet is skipped.
COMMAND_MODULES = [
    "mindmotor.worker.cli",        # worker
    "mindmotor.npu_smi_cli",        # npu-smi
    "mindmotor.device.emulate_cli",  # emulate step
    "mindmotor.simulator.cli",     # simulate
    "mindmotor.trainer.cli",       # train, trainer, debug compare
    "mindmotor.coordinator.cli",   # coordinator
    "mindmotor.controller.cli",    # controller
    "mindmotor.deployer.cli",      # deployer, deploy
    "mindmotor.operator.cli",      # operator (InferenceService)
    "mindmotor.launcher.cli",      # up
    "mindmotor.common.certs_cli",  # certs
    "mindmotor.analysis.cli",      # analyze latency
]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mindmotor")
    except PackageNotFoundError:          # run from a source tree that was not installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mindmotor", description="MindMotor LLM serving platform")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):  # the area is not built (yet)
                continue
            raise
        module.register(subparsers)
    for command in subparsers.choices.values():      # every command logs the same way
        command.add_argument("--log-format", choices=LOG_FORMATS, default=None,
                             help="auto (default): text on a terminal, JSON lines otherwise; json; text "
                                  f"(also: ${LOG_FORMAT_ENV}; the services a command starts inherit it)")
    return parser


def main(argv: list[str] | None = None) -> int:
    # The serving engine's matrices are small: a threaded BLAS only adds contention (host step
    # times on 2 cores were 4-20x worse and erratic with it; docs/benchmarks.md). One thread per
    # process unless the user says otherwise; numpy is not imported before this point.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.log_format:
        os.environ[LOG_FORMAT_ENV] = args.log_format
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
