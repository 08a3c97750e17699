"""Command-line flags for a service's settings (common/settings.py): each flag names the setting it
sets, and is added with default None, so that an absent flag leaves the setting to the environment,
the `--config` file or its default; `--help` shows that default (`SettingsHelpFormatter`).

    FLAGS = Flags("mindmotor.controller.config:ControllerConfig")
    FLAGS.add_config(parser)
    FLAGS.add(group, "--heartbeat-interval", type=float, setting="heartbeat_interval_s",
              help="seconds between worker heartbeats (default: %(default)s)")
    config = FLAGS.load(args)

Importing this costs nothing: the settings class (pydantic) is imported only when the flags are
read or `--help` is printed, so building `mindmotor`'s parser stays cheap.
"""

from __future__ import annotations

import argparse
import copy
import importlib
from pathlib import Path
from typing import Any, Callable

ENV_PREFIX = "MINDMOTOR_"


def env_name(setting: str) -> str:
    """The environment variable of a setting: `engine.max_num_seqs` -> MINDMOTOR_ENGINE__MAX_NUM_SEQS."""
    return ENV_PREFIX + "__".join(setting.split(".")).upper()


class _Binding:
    """One flag's setting: its dotted path and how the flag's value becomes the setting's."""

    def __init__(self, flags: "Flags", path: str, convert: Callable[[Any], Any] | None):
        self.flags, self.path, self.convert = flags, path, convert

    def default(self) -> Any:
        return self.flags.default_of(self.path)


class Flags:
    """The command-line flags of one settings class, named by its import path ("module:Class") so
    that building the parser imports nothing heavy. Every flag is added with default None: absent,
    the environment, the file or the setting's default decide."""

    def __init__(self, settings: str):
        self.settings_path = settings
        self.bindings: dict[str, _Binding] = {}

    @property
    def settings(self) -> type:
        module, _, name = self.settings_path.partition(":")
        return getattr(importlib.import_module(module), name)

    def add_config(self, parser) -> argparse.Action:
        return parser.add_argument("--config", default=None, metavar="FILE.yaml",
                                   help="settings file (YAML); flags win over MINDMOTOR_* environment "
                                        "variables, which win over the file (docs/operations.md)")

    def add(self, parser, *names: str, setting: str | None = None, convert: Callable[[Any], Any] | None = None,
            **kwargs) -> argparse.Action:
        """`parser.add_argument(*names, **kwargs)` for the setting `setting` (default: the flag's
        dest); `convert` turns the flag's value into the setting's (e.g. a negating switch)."""
        kwargs.setdefault("default", None)
        action = parser.add_argument(*names, **kwargs)
        binding = _Binding(self, setting or action.dest, convert)
        self.bindings[action.dest] = binding
        action.setting = binding                 # for SettingsHelpFormatter and the tests
        return action

    def overrides(self, args: argparse.Namespace) -> dict[str, Any]:
        """The settings the flags given set, nested by their dotted paths."""
        found: dict[str, Any] = {}
        for dest, binding in self.bindings.items():
            value = getattr(args, dest, None)
            if value is None:
                continue
            if binding.convert is not None:
                value = binding.convert(value)
            *parents, last = binding.path.split(".")
            node = found
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
        return found

    def load(self, args: argparse.Namespace):
        """The settings of `args`: the flags given, the environment, their `--config` file."""
        return self.settings.load(getattr(args, "config", None), **self.overrides(args))

    def default_of(self, path: str) -> Any:
        name, *rest = path.split(".")
        field = self.settings.model_fields[name]
        value = None if field.default_factory is not None else field.default
        for part in rest:
            value = getattr(value, part)
        return value


class SettingsHelpFormatter(argparse.HelpFormatter):
    """`%(default)s` in the help of a bound flag shows its setting's default (the flag's own
    default is None)."""

    def _expand_help(self, action: argparse.Action) -> str:
        binding = getattr(action, "setting", None)
        if binding is not None and action.help and "%(default)" in action.help:
            action = copy.copy(action)
            default = binding.default()
            action.default = str(default) if isinstance(default, Path) else default
        return super()._expand_help(action)
