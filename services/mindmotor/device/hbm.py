"""HBM accounting: what is resident on the emulated card, and how many KV blocks fit.

Like MindIE (`NPU_MEMORY_FRACTION`) and vLLM (`gpu_memory_utilization`), only a fraction of
the card's HBM is ours; weights and an activation workspace come first and the rest of that
budget becomes the paged KV pool, in whole blocks. MindIE's rule: the HBM already in use when
the server starts (the runtime's own reservation, `DeviceSpec.hbm_runtime_reserved_bytes`) is
subtracted too — it is allocated first, as "runtime".
"""

from __future__ import annotations

from dataclasses import dataclass

from mindmotor.device.profiles import ModelProfile
from mindmotor.device.specs import GiB, DeviceSpec

# Sampled rows whose fp32 logits the workspace holds at once (cap on one step's sequences).
MAX_LOGIT_ROWS = 256


def _gib(nbytes: float) -> str:
    return f"{nbytes / GiB:.2f} GiB"


class DeviceOutOfMemoryError(MemoryError):
    """An allocation that does not fit under the HBM budget; the message gives the numbers."""

    def __init__(self, *, device: str, tag: str, requested: int, used: int, budget: int,
                 total: int, memory_fraction: float) -> None:
        self.device, self.tag = device, tag
        self.requested, self.used, self.budget, self.total = requested, used, budget, total
        super().__init__(
            f"NPU out of memory on {device}: cannot allocate {_gib(requested)} for {tag}; "
            f"{_gib(used)} already used of a {_gib(budget)} budget "
            f"(memory_fraction {memory_fraction:.2f} of {_gib(total)} HBM), "
            f"{_gib(max(0, budget - used))} free"
        )


class HBMAllocator:
    """Named allocations against `memory_fraction x HBM`."""

    def __init__(self, spec: DeviceSpec, memory_fraction: float = 0.8) -> None:
        if not 0.0 < memory_fraction <= 1.0:
            raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
        self.spec = spec
        self.memory_fraction = memory_fraction
        self.total = spec.hbm_bytes
        self.budget = int(memory_fraction * spec.hbm_bytes)
        self._allocations: dict[str, int] = {}

    @property
    def used(self) -> int:
        return sum(self._allocations.values())

    @property
    def free(self) -> int:
        return self.budget - self.used

    @property
    def allocations(self) -> dict[str, int]:
        return dict(self._allocations)

    def allocate(self, tag: str, nbytes: int, *, purpose: str | None = None) -> None:
        """Reserve `nbytes` under `tag`; `purpose` only enriches an out-of-memory message."""
        if nbytes < 0:
            raise ValueError(f"allocation {tag!r} has negative size {nbytes}")
        if tag in self._allocations:
            raise ValueError(f"allocation {tag!r} already exists")
        if nbytes > self.free:
            raise DeviceOutOfMemoryError(
                device=self.spec.name, tag=purpose or tag, requested=int(nbytes), used=self.used,
                budget=self.budget, total=self.total, memory_fraction=self.memory_fraction)
        self._allocations[tag] = int(nbytes)

    def release(self, tag: str) -> int:
        """Frees the allocation `tag` and returns its size (KeyError if there is none)."""
        return self._allocations.pop(tag)


@dataclass
class KVPlan:
    num_blocks: int
    block_size: int              # tokens per block
    bytes_per_block: int         # block_size * kv_bytes_per_token
    weight_bytes: int
    workspace_bytes: int
    kv_pool_bytes: int           # num_blocks * bytes_per_block
    budget_bytes: int

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size


def default_workspace_bytes(profile: ModelProfile, max_num_batched_tokens: int) -> int:
    """Peak activation memory of one step, per device.

    At the MLP, for N = max_num_batched_tokens tokens, these are live together:
      residual + normed hidden   [N, hidden]           x2
      QKV output                 [N, (hq + 2 hkv) e]
      gate and up outputs        [N, I/tp]             x2
    all in the model dtype, plus fp32 logits [min(N, 256), V/tp] for the sampled rows.
    """
    n = max_num_batched_tokens
    per_token = (2 * profile.hidden_size
                 + (profile.heads_per_device + 2 * profile.kv_heads_per_device) * profile.head_dim
                 + 2 * profile.intermediate_per_device)
    logits = min(n, MAX_LOGIT_ROWS) * profile.vocab_per_device * 4
    return n * per_token * profile.dtype_bytes + logits


def plan_kv_cache(spec: DeviceSpec, profile: ModelProfile, block_size: int = 16,
                  memory_fraction: float = 0.8, workspace_bytes: int | None = None,
                  max_num_batched_tokens: int = 8192,
                  runtime_reserved_bytes: int | None = None) -> tuple[HBMAllocator, KVPlan]:
    """Allocate the runtime's reservation (default: the spec's), weights, workspace, then every
    remaining whole KV block."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if workspace_bytes is None:
        workspace_bytes = default_workspace_bytes(profile, max_num_batched_tokens)

    if runtime_reserved_bytes is None:
        runtime_reserved_bytes = spec.hbm_runtime_reserved_bytes

    allocator = HBMAllocator(spec, memory_fraction)
    if runtime_reserved_bytes:
        allocator.allocate("runtime", runtime_reserved_bytes,
                           purpose="the HBM the runtime already uses (MindIE's KV-pool rule)")
    allocator.allocate("weights", profile.weight_bytes,
                       purpose=f"the weights of {profile.name} (tp={profile.tp})")
    allocator.allocate("workspace", workspace_bytes, purpose="the activation workspace")

    bytes_per_block = block_size * profile.kv_bytes_per_token
    num_blocks = allocator.free // bytes_per_block
    if num_blocks < 1:
        raise DeviceOutOfMemoryError(
            device=spec.name, tag=f"the KV cache (at least 1 block of {block_size} tokens)",
            requested=bytes_per_block, used=allocator.used, budget=allocator.budget,
            total=allocator.total, memory_fraction=memory_fraction)
    kv_pool_bytes = num_blocks * bytes_per_block
    allocator.allocate("kv_cache", kv_pool_bytes)

    plan = KVPlan(num_blocks=num_blocks, block_size=block_size, bytes_per_block=bytes_per_block,
                  weight_bytes=profile.weight_bytes, workspace_bytes=workspace_bytes,
                  kv_pool_bytes=kv_pool_bytes, budget_bytes=allocator.budget)
    return allocator, plan
