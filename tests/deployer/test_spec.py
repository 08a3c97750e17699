"""Deployment specs: what a valid one looks like, and one clear line per problem otherwise;
checkpoint verification with the model's own checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindmotor.deployer.backends.base import VersionTarget
from mindmotor.deployer.backends.command import worker_args
from mindmotor.deployer.spec import SpecError, load_spec, parse_spec, verify_checkpoint
from mindmotor.model.config import CheckpointError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "deployments"


def errors_of(data) -> list[str]:
    with pytest.raises(SpecError) as refused:
        parse_spec(data)
    return str(refused.value).splitlines()[1:]


def test_a_minimal_spec_gets_its_defaults():
    spec = parse_spec({"name": "demo", "model": "m", "versions": [{"name": "v1"}, {"name": "v2", "replicas": 3}]})
    assert [(v.name, v.checkpoint, v.replicas, v.worker) for v in spec.versions] == [("v1", "", 1, {}), ("v2", "", 3, {})]
    assert spec.traffic == {"v1": 1.0, "v2": 1.0}                       # no traffic: every version equally


def test_roles_worker_settings_and_the_worker_command():
    spec = parse_spec({"name": "demo", "model": "served", "versions": [{
        "name": "v1", "checkpoint": "/ckpt", "replicas": 4, "prefill": 1, "decode": 2,
        "worker": {"device": "910B4", "max-model-len": 512, "no_prefix_caching": True, "timing": "virtual"}}]})
    version = spec.versions[0]
    assert [version.role_of(slot) for slot in range(4)] == ["prefill", "decode", "decode", "mixed"]
    assert version.worker == {"device": "910B4", "max_model_len": "512", "no_prefix_caching": "true",
                              "timing": "virtual"}
    args = worker_args(VersionTarget(spec, version), "decode", "ctl:1", "demo-v1-1")
    assert args == ["worker", "--controller", "ctl:1", "--served-model-name", "served", "--deployment", "demo",
                    "--version", "v1", "--role", "decode", "--worker-id", "demo-v1-1", "--model", "/ckpt",
                    "--device", "910B4", "--max-model-len", "512", "--no-prefix-caching", "--timing", "virtual"]


@pytest.mark.parametrize("data, expected", [
    ({"name": "demo", "model": "m", "versions": [{"name": "v1", "replicas": -1}], "colour": "red"},
     ["  versions[0].replicas: Input should be greater than or equal to 0 (got -1)", "  colour: unknown field (got \"red\")"]),
    ({"name": "Demo_1", "model": "m", "versions": [{"name": "v1"}]},
     ["  name: must match ^[a-z]([a-z0-9-]{0,22}[a-z0-9])?$ (got \"Demo_1\")"]),
    ({"name": "demo", "model": "m", "versions": [{"name": "v1"}], "traffic": {"v1": 1, "v2": 1}},
     ["  traffic: names unknown versions v2 (versions: v1)"]),
    ({"name": "demo", "model": "m", "versions": [{"name": "v1"}, {"name": "v2"}], "traffic": {"v1": 0, "v2": 0}},
     ["  traffic: weights must sum to more than 0"]),
    ({"name": "demo", "model": "m", "versions": [{"name": "v1"}], "traffic": {"v1": -5}},
     ["  traffic: weights must be at least 0; negative for v1"]),
    ({"name": "demo", "model": "m", "versions": [{"name": "v1"}, {"name": "v1"}]},
     ["  versions: version names must be unique; repeated: v1"]),
    ({"name": "demo", "model": "m", "versions": [{"name": "v1", "replicas": 1, "prefill": 1, "decode": 1}]},
     ["  versions[0]: prefill (1) + decode (1) exceed replicas (1)"]),
    ({"name": "demo", "versions": []},
     ["  model: Field required", "  versions: List should have at least 1 item after validation, not 0 (got [])"]),
    ({"name": "demo", "model": "m", "versions": [{"name": "v1", "worker": {"port": 1}}]},
     ["  versions[0].worker: port: set by the deployer for every replica, not by the spec"]),
    ({"name": "demo", "model": "m", "versions": [{"name": "v1", "worker": {"timing": "sometimes"}}]},
     ["  versions[0].worker: worker settings: argument --timing: invalid choice: 'sometimes' "
      "(choose from 'realtime', 'virtual')"]),
    ({"name": "demo", "model": "m", "versions": [{"name": "v1", "worker": {"devise": "910B3"}}]},
     None),
    ({"name": "demo", "model": "m", "versions": [{"name": "v1", "resources": {"gpu": 1}}]},
     ["  versions[0].resources: a mapping with the keys cpu, memory"]),
])
def test_invalid_specs_name_each_problem(data, expected):
    lines = errors_of(data)
    if expected is None:
        assert lines[0].startswith("  versions[0].worker: devise: not a `mindmotor worker` setting; known: ")
    else:
        assert lines == expected


def test_files_yaml_json_and_relative_checkpoints(tmp_path):
    (tmp_path / "ckpts").mkdir()
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("name: demo\nmodel: m\nversions:\n  - {name: v1, checkpoint: ckpts/a}\n")
    assert load_spec(spec_file).versions[0].checkpoint == str(tmp_path / "ckpts" / "a")
    json_file = tmp_path / "spec.json"
    json_file.write_text('{"name": "demo", "model": "m", "versions": [{"name": "v1", "checkpoint": "/abs"}]}')
    assert load_spec(json_file).versions[0].checkpoint == "/abs"

    spec_file.write_text("name: demo\nversions: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML/JSON"):
        load_spec(spec_file)
    spec_file.write_text("- a list\n")
    with pytest.raises(SpecError, match="the top level must be a mapping"):
        load_spec(spec_file)
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")


def test_the_example_specs_are_valid():
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert files
    for path in files:
        spec = load_spec(path)
        for version in spec.versions:
            verify_checkpoint(version.checkpoint)


def test_checkpoint_verification(tiny_ckpt, manifest_ckpt, tampered_ckpt, tmp_path):
    assert verify_checkpoint("").name == "mindmotor-demo"                   # the bundled model
    assert verify_checkpoint(str(tiny_ckpt)) == tiny_ckpt.resolve()         # no manifest: the config is checked
    assert verify_checkpoint(str(manifest_ckpt)) == manifest_ckpt.resolve()
    with pytest.raises(CheckpointError, match="tokenizer_config.json: sha256 .* does not match mindmotor.json"):
        verify_checkpoint(str(tampered_ckpt))
    with pytest.raises(CheckpointError, match="does not exist"):
        verify_checkpoint(str(tmp_path / "missing"))
    with pytest.raises(CheckpointError, match="config.json: missing"):
        verify_checkpoint(str(tmp_path))
