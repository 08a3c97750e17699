"""The Deployer deployments `mindmotor up` runs: one per entry of the config's `models:`, with one
version `v1` whose replicas are that model's workers.

    specs = deployment_specs(config)      # SpecError / ValueError for a config that cannot run

The served model name is the entry's `served_model_name`, else the checkpoint directory's name; the
deployment's name is the entry's `name`, else that name made a valid deployment name. A model's
`device`, `emulate`, `tp`, `timing`, `node` and `extra_args` become the version's `worker:`
settings (checked against `mindmotor worker`'s own flags); `roles` become its prefill/decode counts.
"""

from __future__ import annotations

import argparse
import re

from mindmotor.common.roles import Role
from mindmotor.deployer.spec import DeploymentSpec, SpecError, parse_spec
from mindmotor.model.checkpoint import resolve_model_dir

from .config import ModelSpec, PlatformConfig

VERSION = "v1"


def deployment_specs(config: PlatformConfig) -> list[DeploymentSpec]:
    specs = [deployment_spec(model, index) for index, model in enumerate(config.models)]
    for key, what in ((lambda s: s.name, "deployment name"), (lambda s: s.model, "served model name")):
        seen = [key(s) for s in specs]
        repeated = sorted({n for n in seen if seen.count(n) > 1})
        if repeated:
            raise ValueError(f"models: two entries have the same {what} {', '.join(repeated)}; "
                             "give each its own `name` (and checkpoint directory)")
    return specs


def deployment_spec(model: ModelSpec, index: int = 0) -> DeploymentSpec:
    directory = resolve_model_dir(model.path)
    roles = [model.role_of(w) for w in range(model.workers)]
    worker = {"device": model.device, "tp": model.tp, "timing": model.timing,
              **({"emulate": model.emulate} if model.emulate else {}),
              **({"node": model.node} if model.node else {}),
              **settings_from_flags(model.extra_args)}
    version = {"name": VERSION, "checkpoint": str(directory) if model.path else None, "replicas": model.workers,
               "prefill": roles.count(Role.PREFILL), "decode": roles.count(Role.DECODE), "worker": worker}
    try:
        return parse_spec({"name": model.name or deployment_name(directory.name, index),
                           "model": model.served_model_name or directory.name,
                           "versions": [version], "traffic": {VERSION: 100}}, f"models[{index}]")
    except SpecError as exc:
        raise ValueError(str(exc)) from None


def deployment_name(model_name: str, index: int) -> str:
    """`Qwen2_7B.Instruct` → `qwen2-7b-instruct`: lower case, runs of other characters a `-`, starting
    with a letter, at most 24 characters."""
    name = re.sub(r"[^a-z0-9]+", "-", model_name.lower()).lstrip("-0123456789")[:24].rstrip("-")
    return name or f"model-{index}"


def settings_from_flags(flags: list[str]) -> dict[str, object]:
    """`["--max-num-seqs", "64", "--no-prefix-caching"]` → `{"max_num_seqs": "64", "no_prefix_caching": True}`
    (ValueError for a flag `mindmotor worker` does not have)."""
    from mindmotor.worker.cli import add_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    actions = {option: action for action in parser._actions for option in action.option_strings}
    settings: dict[str, object] = {}
    items = iter(flags)
    for item in items:
        flag, equals, value = item.partition("=")
        action = actions.get(flag)
        if action is None:
            raise ValueError(f"extra_args: {item!r} is not a `mindmotor worker` flag")
        if action.nargs == 0:
            if equals:
                raise ValueError(f"extra_args: {flag} is a switch and takes no value")
            settings[action.dest] = True
            continue
        if not equals:
            value = next(items, None)
            if value is None:
                raise ValueError(f"extra_args: {flag} needs a value")
        settings[action.dest] = value
    return settings
