import pytest

from mindmotor.device.specs import DEVICE_SPECS, GiB, get_device_spec


def test_910b3_defaults():
    spec = get_device_spec("910B3")
    assert spec.ai_cores == 20 and spec.clock_ghz == 1.8
    assert spec.peak_flops["bf16"] == pytest.approx(294.9e12)
    assert spec.peak_flops["fp16"] == pytest.approx(313e12)
    assert spec.peak_flops["int8"] == pytest.approx(626e12)
    assert spec.hbm_bytes == 64 * GiB
    assert spec.hbm_bandwidth == pytest.approx(1.6e12)
    assert spec.intra_node_bandwidth == pytest.approx(196e9)
    assert spec.inter_node_bandwidth == pytest.approx(25e9)


def test_all_devices_present_with_all_dtypes():
    assert {"910B3", "910B4", "910B1", "A100-80G", "H100-SXM"} <= set(DEVICE_SPECS)
    for spec in DEVICE_SPECS.values():
        assert set(spec.peak_flops) >= {"bf16", "fp16", "int8", "fp32"}
        assert spec.idle_watts < spec.tdp_watts
        assert spec.source


def test_comparison_devices():
    assert get_device_spec("910B4").hbm_bytes == 32 * GiB
    assert get_device_spec("910B4").hbm_bandwidth == pytest.approx(0.8e12)
    assert get_device_spec("910B4").peak_flops["bf16"] == pytest.approx(246e12, rel=0.01)
    h100 = get_device_spec("H100-SXM")
    assert h100.peak_flops["bf16"] == pytest.approx(989e12) and h100.tdp_watts == 700
    assert get_device_spec("A100-80G").hbm_bandwidth == pytest.approx(2.039e12)


def test_lookup_is_case_insensitive():
    assert get_device_spec("910b3") is get_device_spec("910B3")
    assert get_device_spec("h100-sxm").name == "H100-SXM"


def test_unknown_device_lists_valid_names():
    with pytest.raises(ValueError) as info:
        get_device_spec("910C")
    assert "910B3" in str(info.value) and "H100-SXM" in str(info.value)


def test_spec_is_immutable():
    spec = get_device_spec("910B3")
    with pytest.raises(Exception):
        spec.hbm_bytes = 1
    with pytest.raises(TypeError):
        spec.peak_flops["bf16"] = 1.0


def test_new_ascend_cards_and_kernel_parameters():
    b2 = get_device_spec("910B2")
    assert b2.ai_cores == 24 and b2.peak_flops["fp16"] == pytest.approx(24 * 1.8e9 * 8192, rel=1e-3)
    card = get_device_spec("atlas-800i-a2-64g")
    assert card.name == "910B4-64G" and card.hbm_bytes == 64 * GiB
    assert card.peak_flops == get_device_spec("910B4").peak_flops
    for spec in DEVICE_SPECS.values():
        k = spec.kernels
        assert k.source and 0 < k.gemm_eta_memory <= 1 and 0 < k.attention_prefill_eta_compute <= 1
        assert k.fused_elementwise == (spec.vendor == "Huawei")      # MindIE/ATB fuse, vLLM does not
        assert spec.hbm_runtime_reserved_bytes > 0
