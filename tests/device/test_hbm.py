import pytest

from mindmotor.device.hbm import (
    DeviceOutOfMemoryError,
    HBMAllocator,
    default_workspace_bytes,
    plan_kv_cache,
)
from mindmotor.device.profiles import get_profile
from mindmotor.device.specs import GiB, get_device_spec

SPEC = get_device_spec("910B3")


def test_allocator_accounting_and_release():
    allocator = HBMAllocator(SPEC, memory_fraction=0.5)
    assert allocator.budget == 32 * GiB
    allocator.allocate("a", 10 * GiB)
    allocator.allocate("b", 20 * GiB)
    assert allocator.used == 30 * GiB and allocator.free == 2 * GiB
    assert allocator.allocations == {"a": 10 * GiB, "b": 20 * GiB}
    with pytest.raises(DeviceOutOfMemoryError):
        allocator.allocate("c", 3 * GiB)
    assert allocator.release("a") == 10 * GiB
    allocator.allocate("c", 3 * GiB)
    assert allocator.used == 23 * GiB
    with pytest.raises(ValueError):
        allocator.allocate("c", 1)                             # duplicate tag


def test_qwen2_7b_block_count_by_hand():
    h, inter, layers, vocab = 3584, 18944, 28, 152064
    per_layer = h * (28 + 2 * 4) * 128 + 28 * 128 * h + 3 * h * inter + 2 * h
    weight_bytes = 2 * (layers * per_layer + 2 * vocab * h + h)   # untied embeddings
    budget = int(0.8 * 64 * 2**30)
    bytes_per_block = 16 * 57344
    reserved = 3 * 10**9                                       # in use before the server (MindIE rule)
    expected_blocks = (budget - reserved - weight_bytes - 2**30) // bytes_per_block

    allocator, plan = plan_kv_cache(SPEC, get_profile("qwen2-7b"), workspace_bytes=2**30)
    assert plan.weight_bytes == weight_bytes
    assert plan.bytes_per_block == bytes_per_block
    assert plan.num_blocks == expected_blocks
    assert plan.kv_pool_bytes == expected_blocks * bytes_per_block
    assert plan.budget_bytes == budget
    assert allocator.free < bytes_per_block                   # whole budget used, in whole blocks
    assert set(allocator.allocations) == {"runtime", "weights", "workspace", "kv_cache"}
    _, without_rule = plan_kv_cache(SPEC, get_profile("qwen2-7b"), workspace_bytes=2**30,
                                    runtime_reserved_bytes=0)
    assert without_rule.num_blocks == (budget - weight_bytes - 2**30) // bytes_per_block


def test_default_workspace_formula():
    profile = get_profile("qwen2-7b")
    n = 8192
    per_token = 2 * 3584 + (28 + 8) * 128 + 2 * 18944
    assert default_workspace_bytes(profile, n) == n * per_token * 2 + 256 * 152064 * 4
    _, plan = plan_kv_cache(SPEC, profile, max_num_batched_tokens=n)
    assert plan.workspace_bytes == default_workspace_bytes(profile, n)


def test_llama3_70b_tp1_does_not_fit_and_says_why():
    with pytest.raises(DeviceOutOfMemoryError) as info:
        plan_kv_cache(SPEC, get_profile("llama3-70b"))
    message = str(info.value)
    weights_gib = get_profile("llama3-70b").weight_bytes / GiB
    assert f"{weights_gib:.2f} GiB" in message                # requested
    assert "51.20 GiB budget" in message and "64.00 GiB HBM" in message
    assert "2.79 GiB already used" in message                 # the runtime's 3 GB
    assert "llama3-70b" in message
    assert info.value.requested == get_profile("llama3-70b").weight_bytes


def test_llama3_70b_tp8_fits():
    _, plan = plan_kv_cache(SPEC, get_profile("llama3-70b", tp=8))
    assert plan.num_blocks > 1000


def test_no_room_for_one_block_is_an_error():
    profile = get_profile("llama2-7b")
    budget = int(0.8 * SPEC.hbm_bytes)
    workspace = budget - 3 * 10**9 - profile.weight_bytes - 10   # leaves 10 bytes
    with pytest.raises(DeviceOutOfMemoryError, match="KV cache"):
        plan_kv_cache(SPEC, profile, workspace_bytes=workspace)


def test_atlas_800i_a2_64g_serves_qwen2_7b_at_tp4():
    """The card of MindIE's published Qwen2-7B sample (TP 4) exists, by either name."""
    from mindmotor.device.specs import get_device_spec
    card = get_device_spec("Atlas-800I-A2-64G")
    assert card is get_device_spec("910B4-64G") and card.hbm_bytes == 64 * GiB
    _, plan = plan_kv_cache(card, get_profile("qwen2-7b", tp=4))
    _, small = plan_kv_cache(get_device_spec("910B4"), get_profile("qwen2-7b", tp=4))
    assert plan.num_blocks > 2 * small.num_blocks
