"""The emulated card prices a step's LoRA work (BGMV shrink + expand) and a slot load's copy."""

from __future__ import annotations

import pytest

from mindmotor.device.cost_model import CostModel, LoraStepShape, StepShape
from mindmotor.device.profiles import get_profile
from mindmotor.device.specs import get_device_spec

QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")


def model():
    return CostModel(get_device_spec("910B3"), get_profile("qwen2-7b"))


def test_lora_rows_cost_flops_kernels_and_each_adapters_weights_once():
    cm = model()
    base = StepShape(decodes=[1000] * 32)
    one = StepShape(decodes=[1000] * 32, lora=LoraStepShape(rows=32, adapters=1, rank=8, targets=QKVO))
    four = StepShape(decodes=[1000] * 32, lora=LoraStepShape(rows=32, adapters=4, rank=8, targets=QKVO))
    op1, op4 = cm.operators(one)["lora"], cm.operators(four)["lora"]
    layers = cm.profile.num_layers
    assert op1.kernels == 2 * layers * 2                      # shrink + expand on qkv and on o, per layer
    assert op1.flops == op4.flops                             # the same rows at the same rank
    adapter = cm.lora_adapter_bytes(8, QKVO)
    assert op4.bytes - op1.bytes == 3 * adapter                # each distinct adapter's A and B read once
    assert cm.step(base).seconds < cm.step(one).seconds < cm.step(four).seconds < 1.1 * cm.step(base).seconds
    assert "lora" not in cm.operators(base)


def test_a_slot_load_is_priced_on_the_host_link():
    cm = model()
    nbytes = cm.lora_adapter_bytes(8, QKVO)
    assert 10e6 < nbytes < 10.2e6                              # rank 8 on q/k/v/o of qwen2-7b: ~10 MB
    assert cm.host_copy_seconds(nbytes) == pytest.approx(10e-6 + nbytes / (0.8 * cm.spec.host_link_bandwidth))
