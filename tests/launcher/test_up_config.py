"""What `mindmotor up` makes of its config: one Deployer deployment per model (worker settings from
the model's fields and `extra_args`, roles as prefill/decode counts), every port settable, and
each service's secrets in its environment only."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mindmotor.launcher.config import PlatformConfig
from mindmotor.launcher.deployments import deployment_name, deployment_specs
from mindmotor.launcher.up import child_env


def config(**fields) -> PlatformConfig:
    return PlatformConfig.model_validate(fields)


def test_a_model_becomes_a_deployment_with_its_workers_as_replicas():
    (spec,) = deployment_specs(config(models=[{
        "roles": ["decode", "prefill", "mixed"], "timing": "virtual", "emulate": "qwen2-7b", "node": "n1",
        "extra_args": ["--max-num-seqs", "8", "--no-prefix-caching", "--max-model-len=512"]}]))
    assert (spec.name, spec.model, spec.traffic) == ("mindmotor-demo", "mindmotor-demo", {"v1": 100.0})
    (version,) = spec.versions
    assert (version.name, version.replicas, version.prefill, version.decode) == ("v1", 3, 1, 1)
    assert version.worker == {"device": "910B3", "tp": "1", "timing": "virtual", "emulate": "qwen2-7b", "node": "n1",
                              "max_num_seqs": "8", "no_prefix_caching": "true", "max_model_len": "512"}


def test_bad_worker_flags_and_clashing_models_are_refused_before_anything_starts(tmp_path):
    for flags, message in ((["--port", "1"], "set by the deployer"), (["--no-such-flag"], "not a `mindmotor worker`"),
                           (["--max-num-seqs"], "needs a value"), (["--max-num-seqs", "many"], "invalid int")):
        with pytest.raises(ValueError, match=message):
            deployment_specs(config(models=[{"extra_args": flags}]))
    with pytest.raises(ValueError, match="same deployment name"):
        deployment_specs(config(models=[{}, {}]))
    with pytest.raises(ValidationError):
        config(ports={"deployer": 70000})
    with pytest.raises(ValidationError):
        config(ports={"workers": 1})


def test_deployment_names_from_model_directories():
    assert deployment_name("Qwen2_7B.Instruct", 0) == "qwen2-7b-instruct"
    assert deployment_name("7b", 3) == "b"
    assert deployment_name("___", 3) == "model-3"
    assert len(deployment_name("a" * 40, 0)) == 24


def test_each_service_gets_only_its_secrets_and_inherited_ones_are_removed(monkeypatch):
    monkeypatch.setenv("MINDMOTOR_API_KEYS", "from-the-shell")
    cfg = config(api_keys=["k1", "k2"], admin_token="T", redis_url="redis://127.0.0.1:6379/0")
    assert child_env("coordinator", cfg) == {"MINDMOTOR_API_KEYS": "k1,k2", "MINDMOTOR_ADMIN_TOKEN": None,
                                             "MINDMOTOR_REDIS_URL": "redis://127.0.0.1:6379/0"}
    assert child_env("controller", cfg) == {"MINDMOTOR_API_KEYS": None, "MINDMOTOR_ADMIN_TOKEN": "T",
                                            "MINDMOTOR_REDIS_URL": "redis://127.0.0.1:6379/0"}
    assert child_env("deployer", config()) == dict.fromkeys(
        ("MINDMOTOR_API_KEYS", "MINDMOTOR_ADMIN_TOKEN", "MINDMOTOR_REDIS_URL"))


def test_mindmotor_says_its_version(capsys):
    from importlib.metadata import version

    from mindmotor.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"mindmotor {version('mindmotor')}"


def test_up_takes_its_api_keys_from_a_file(tmp_path, monkeypatch):
    from mindmotor.cli import build_parser

    monkeypatch.delenv("MINDMOTOR_API_KEYS", raising=False)
    keys = tmp_path / "keys"
    keys.write_text("sk-one\nsk-two\n")
    args = build_parser().parse_args(["up", "--api-key-file", str(keys)])
    assert PlatformConfig.load(args.config, api_key_file=args.api_key_file).api_keys == ["sk-one", "sk-two"]


def test_the_example_platform_file_names_every_key_with_its_default():
    """examples/platform.yaml is the documented list of `up`'s settings: it loads, it starts what
    `mindmotor up` alone starts, and no setting is missing from it."""
    import yaml
    from pathlib import Path
    from pydantic import BaseModel

    example = Path(__file__).resolve().parents[2] / "examples" / "platform.yaml"
    data = yaml.safe_load(example.read_text())
    assert PlatformConfig.load(example).model_dump() == PlatformConfig.load().model_dump()

    def missing(model: type[BaseModel], given: dict, where: str) -> list[str]:
        gaps = []
        for name, field in model.model_fields.items():
            if name not in given:
                gaps.append(where + name)
                continue
            inner, value = field.annotation, given[name]
            item = getattr(inner, "__args__", (None,))[0] if isinstance(value, list) and value else None
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                gaps += missing(inner, value, f"{where}{name}.")
            elif isinstance(item, type) and issubclass(item, BaseModel):
                gaps += missing(item, value[0], f"{where}{name}[0].")
        return gaps

    assert missing(PlatformConfig, data, "") == []
