"""`mindmotor emulate step` as a user runs it (a real subprocess for the JSON contract)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mindmotor.cli import main
from mindmotor.device.cost_model import CostModel, StepShape
from mindmotor.device.profiles import get_profile
from mindmotor.device.specs import get_device_spec

SERVICES = Path(__file__).resolve().parents[2] / "services"


def test_json_matches_the_cost_model_and_names_the_operators():
    env = {**os.environ, "PYTHONPATH": str(SERVICES)}
    out = subprocess.run([sys.executable, "-m", "mindmotor.cli", "emulate", "step", "--device", "910B3",
                          "--model", "llama3-70b", "--tp", "8", "--decode", "16x1000", "--decode", "2x50",
                          "--prefill", "256:512", "--json"],
                         capture_output=True, text=True, env=env, timeout=60, check=True).stdout
    result = json.loads(out)
    shape = StepShape(prefills=[(256, 512)], decodes=[1000] * 16 + [50] * 2)
    want = CostModel(get_device_spec("910B3"), get_profile("llama3-70b", tp=8)).step(shape)
    assert result["seconds"] == pytest.approx(want.seconds)
    assert result["operators"] == pytest.approx(want.breakdown)
    assert set(result) == {"seconds", "operators"}
    assert {"qkv_proj", "o_proj", "mlp_gate_up", "mlp_down", "attention_decode", "attention_prefill",
            "elementwise", "kv_cache_write", "embedding", "lm_head", "all_reduce", "host"} == set(result["operators"])


def test_table_and_hf_config(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(
        {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
         "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32000}))
    assert main(["emulate", "step", "--device", "A100-80G", "--model", str(tmp_path / "config.json"),
                 "--decode", "1x2048"]) == 0
    text = capsys.readouterr().out
    want = CostModel(get_device_spec("A100-80G"), get_profile("llama2-7b")).step(StepShape(decodes=[2048]))
    assert f"{want.seconds * 1e3:.3f} ms" in text and "attention_decode" in text and "memory-bound" in text


@pytest.mark.parametrize("argv, message", [
    (["--decode", "8"], "BxK"),
    (["--prefill", "x:3"], "integer"),
    (["--tp", "3", "--decode", "1x1"], "do not split"),
    ([], "empty"),
    (["--device", "910Z", "--decode", "1x1"], "unknown device"),
])
def test_bad_arguments_are_clear_errors(argv, message, capsys):
    assert main(["emulate", "step", "--model", "qwen2-7b", *argv]) == 2
    assert message in capsys.readouterr().err
