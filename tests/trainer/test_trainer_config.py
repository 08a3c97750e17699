"""Training configs are checked completely before any work starts."""

from __future__ import annotations

import pytest

from mindmotor.trainer.config import PRESETS, ConfigError, TrainConfig, load_config
from mindmotor.trainer.validate import validated_config


def test_presets_are_valid_and_demo_has_the_documented_shape():
    for config in PRESETS.values():
        config.check_shapes()
    demo = PRESETS["demo"]
    assert demo.hidden_size == 256 and 4 <= demo.num_hidden_layers <= 6
    assert 4096 <= demo.vocab_size <= 8192 and demo.max_position_embeddings == 4096
    assert demo.seq_len == 512 and demo.corpus == ()   # the stdlib sources


@pytest.mark.parametrize("overrides, message", [
    ({"hidden_sise": 64}, "unknown config keys ['hidden_sise']"),
    ({"hidden_size": 65}, "not a multiple of num_attention_heads"),
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
    ({"hidden_size": 12, "num_attention_heads": 4, "num_key_value_heads": 4}, "must be even"),
    ({"seq_len": 1024}, "exceeds max_position_embeddings"),
    ({"vocab_size": 100}, "vocab_size 100 is below 259"),
    ({"batch_size": 5}, "not a multiple of micro_batch_size"),
    ({"steps": 0}, "steps must be positive"),
    ({"steps": "ten"}, "steps must be of type int"),
    ({"precision": "fp8"}, "precision 'fp8'"),
    ({"min_lr": 1.0}, "min_lr"),
])
def test_bad_configs_are_refused_with_the_reason(overrides, message):
    with pytest.raises(ConfigError, match=None) as info:
        load_config("tiny", overrides)
    assert message in str(info.value)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        load_config("huge")


def test_digest_is_stable_and_changes_with_the_config():
    a, b = load_config("tiny"), load_config("tiny")
    assert a.digest() == b.digest()
    assert a.digest() != load_config("tiny", {"seed": 7}).digest()


def test_world_size_must_divide_the_global_batch(corpus_dir, tmp_path):
    with pytest.raises(ConfigError, match="micro_batch_size × processes"):
        validated_config("tiny", {"corpus": [str(corpus_dir)]}, nproc=3, store_root=tmp_path)


def test_missing_and_empty_corpus_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        validated_config("tiny", {"corpus": [str(tmp_path / "nope")]}, 1, tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "blank.txt").write_text("")
    with pytest.raises(ConfigError, match="corpus is empty"):
        validated_config("tiny", {"corpus": [str(empty)]}, 1, tmp_path)


def test_resume_from_a_missing_version_is_refused(corpus_dir, tmp_path):
    with pytest.raises(ConfigError, match="cannot resume from 'latest'"):
        validated_config("tiny", {"corpus": [str(corpus_dir)]}, 1, tmp_path, resume="latest")


def test_corpus_paths_become_absolute(corpus_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(corpus_dir.parent)
    config = validated_config("tiny", {"corpus": corpus_dir.name}, 1, tmp_path)
    assert config.corpus == (str(corpus_dir.resolve()),)
    assert isinstance(config, TrainConfig)


def test_the_quick_preset_keeps_the_demo_vocabulary_and_heads():
    from mindmotor.trainer.config import preset

    quick, demo = preset("quick"), preset("demo")
    same = ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads",
            "max_position_embeddings", "tie_word_embeddings")
    assert [getattr(quick, k) for k in same] == [getattr(demo, k) for k in same]
    assert quick.num_hidden_layers < demo.num_hidden_layers and quick.steps < demo.steps
