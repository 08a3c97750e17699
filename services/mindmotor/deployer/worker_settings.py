"""A version's `worker:` settings: `mindmotor worker` flags by name, checked against the worker's own
command line (`mindmotor.worker.cli.add_arguments`), so that every worker flag is available to a
spec the day it exists and a typo is refused when the spec is applied, not when a replica starts.

    normalize_worker_settings({"device": "910B4", "max_model_len": 512, "no_prefix_caching": True})
    # {"device": "910B4", "max_model_len": "512", "no_prefix_caching": "true"}
    worker_flags({"device": "910B4", "no_prefix_caching": "true"})
    # ["--device", "910B4", "--no-prefix-caching"]

Values are kept as text (that is how the proto carries them); a switch is "true" or "false".
The flags that place a replica — where it listens, which controller, checkpoint, deployment,
version, role, id — belong to the deployer and are refused here.
"""

from __future__ import annotations

import argparse
from functools import lru_cache

# Set by the deployer for every replica; a spec may not set them.
PLACEMENT = frozenset({"host", "port", "metrics_port", "worker_id", "controller", "advertise_address",
                       "served_model_name", "deployment", "version", "weight", "role", "model"})
# A replica's settings are the spec's, not a file's on the machine it happens to run on.
NOT_IN_SPEC = frozenset({"config"})
TRUE, FALSE = "true", "false"


class _Refusing(argparse.ArgumentParser):
    """An argument parser that raises instead of printing usage and exiting."""

    def error(self, message):
        raise ValueError(message)


@lru_cache(maxsize=1)
def _worker_parser() -> _Refusing:
    from mindmotor.worker.cli import add_arguments

    parser = _Refusing(prog="mindmotor worker", add_help=False)
    add_arguments(parser)
    return parser


def _worker_options() -> dict[str, argparse.Action]:
    return {a.dest: a for a in _worker_parser()._actions
            if a.option_strings and a.dest not in PLACEMENT | NOT_IN_SPEC}


def _is_switch(action: argparse.Action) -> bool:
    return action.nargs == 0


def normalize_worker_settings(settings: dict[str, object]) -> dict[str, str]:
    """The settings as text, each checked the way `mindmotor worker` would parse it; ValueError
    naming the setting otherwise."""
    options = _worker_options()
    normalized: dict[str, str] = {}
    for name, value in settings.items():
        key = str(name).replace("-", "_")
        if key in PLACEMENT:
            raise ValueError(f"{name}: set by the deployer for every replica, not by the spec")
        if key in NOT_IN_SPEC:
            raise ValueError(f"{name}: a replica's settings are the spec's (give each one here), not a file's")
        action = options.get(key)
        if action is None:
            raise ValueError(f"{name}: not a `mindmotor worker` setting; known: {', '.join(sorted(options))}")
        normalized[key] = _text(name, value, action)
    _parse(worker_flags(normalized))
    return normalized


def _text(name: str, value: object, action: argparse.Action) -> str:
    if _is_switch(action):
        text = str(value).lower()
        if isinstance(value, bool) or text in (TRUE, FALSE):
            return TRUE if text == "true" else FALSE
        raise ValueError(f"{name}: a switch takes true or false, got {value!r}")
    if value is None or isinstance(value, (dict, list)):
        raise ValueError(f"{name}: takes one value, got {value!r}")
    return str(value).lower() if isinstance(value, bool) else str(value)


def _parse(flags: list[str]) -> None:
    try:
        _worker_parser().parse_args(flags)
    except ValueError as exc:
        raise ValueError(f"worker settings: {exc}") from None


def worker_flags(settings: dict[str, str]) -> list[str]:
    """The `mindmotor worker` flags of normalized settings, in a stable order."""
    options = _worker_options()
    flags: list[str] = []
    for key in sorted(settings):
        action = options[key]
        flag = action.option_strings[0]
        if _is_switch(action):
            if settings[key] == TRUE:
                flags.append(flag)
        else:
            flags += [flag, settings[key]]
    return flags
