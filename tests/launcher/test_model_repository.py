"""A Triton model repository (`config.pbtxt`, platform "mindmotor_llm") as the models `up` serves:
the parse (Triton's own schema from tritonclient, and the built-in subset), the mapping to the
engine's batch limit and batch timeout, and the errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindmotor.launcher.config import PlatformConfig
from mindmotor.launcher.deployments import deployment_specs
from mindmotor.launcher.model_repository import RepositoryError, load_repository, model_spec, parse_config

# the design's MindIE example, with MindMotor's platform, and the sections Triton itself reads
CONFIG = '''
name: "qwen_chat"
platform: "mindmotor_llm"
max_batch_size: 32
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8, 16 ]
  max_queue_delay_microseconds: 2000
}
parameters { key: "checkpoint" value: { string_value: "1/model" } }
parameters { key: "workers" value: { string_value: "3" } }
parameters { key: "timing" value: { string_value: "virtual" } }
'''


def repository(tmp_path: Path, models: dict[str, str]) -> Path:
    for name, text in models.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(text)
    return tmp_path


@pytest.mark.parametrize("triton_schema", [True, False], ids=["tritonclient", "subset"])
def test_a_triton_config_maps_to_the_engine_batch_limits_and_timeout(tmp_path, triton_schema):
    if triton_schema:
        pytest.importorskip("tritonclient.grpc")
    repo = repository(tmp_path, {"qwen_chat": CONFIG})
    assert model_spec(repo / "qwen_chat", triton_schema) == {
        "name": "qwen-chat", "served_model_name": "qwen_chat", "path": str((repo / "qwen_chat" / "1" / "model").resolve()),
        "workers": "3", "timing": "virtual",
        "extra_args": ["--max-num-seqs", "32", "--preferred-batch-size", "4", "--batch-timeout-s", "0.002"]}


def test_up_serves_the_repository_models_under_their_triton_names(tmp_path):
    repo = repository(tmp_path, {"qwen_chat": CONFIG.replace('"1/model"', f'"{tmp_path / "ckpt"}"'),
                                 "small": 'platform: "mindmotor_llm"\n'})
    config = PlatformConfig(model_repository=str(repo))
    assert [(m.served_model_name, m.workers, m.path) for m in config.models] == [
        ("qwen_chat", 3, str(tmp_path / "ckpt")), ("small", 2, None)]
    (tmp_path / "ckpt").mkdir()
    spec = deployment_specs(config)[0]
    assert spec.name == "qwen-chat" and spec.model == "qwen_chat"
    worker = spec.versions[0].worker
    assert (worker["max_num_seqs"], worker["preferred_batch_size"], worker["batch_timeout_s"]) == ("32", "4", "0.002")


def test_models_and_a_model_repository_together_are_refused(tmp_path):
    repo = repository(tmp_path, {"m": 'platform: "mindmotor_llm"\n'})
    with pytest.raises(ValueError, match="model_repository or models"):
        PlatformConfig(model_repository=str(repo), models=[{}])


@pytest.mark.parametrize("text, message", [
    ('platform: "mindie_llm"\n', "platform must be 'mindmotor_llm'"),
    ('platform: "mindmotor_llm"\nname: "other"\n', "differs from its directory"),
    ('platform: "mindmotor_llm"\nparameters { key: "gpu" value: { string_value: "1" } }\n', "unknown parameter 'gpu'"),
    ('platform: "mindmotor_llm"\nmax_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 16 ] }\n',
     "between 1 and max_batch_size"),
    ('platform: "mindmotor_llm"\nmax_batch_size: "many"\n', "max_batch_size"),
])
def test_a_config_that_cannot_be_served_is_refused_naming_the_file_and_field(tmp_path, text, message):
    repo = repository(tmp_path, {"m": text})
    with pytest.raises(RepositoryError, match=message) as info:
        load_repository(repo)
    assert str(repo / "m" / "config.pbtxt") in str(info.value)


def test_a_misspelt_field_is_an_error_under_tritons_schema():
    pytest.importorskip("tritonclient.grpc")
    with pytest.raises(RepositoryError, match="max_batch_sise"):
        parse_config('platform: "mindmotor_llm"\nmax_batch_sise: 4\n')


def test_an_empty_repository_or_a_missing_one_is_refused(tmp_path):
    with pytest.raises(RepositoryError, match="holds no model"):
        load_repository(tmp_path)
    with pytest.raises(RepositoryError, match="not a directory"):
        load_repository(tmp_path / "nowhere")
