"""What the simulator runs: instances (roles), the card and model they emulate, routing, limits.

A description is a `ClusterSpec`, built from command-line flags or a JSON file with the same
field names (`mindmotor simulate --cluster cluster.json`).

`frontend_overhead_s` is the serving path around the engine, per request: HTTP, the coordinator,
tokenization, gRPC both ways and SSE to the first chunk. A request reaches its instance that long
after it arrives (where the path's cost falls, way in or way out, moves the TTFT the client sees by
the same amount). It is measured, not chosen: `benchmarks/sim_vs_realtime.py` runs the realtime
platform (four emulated 910B3 workers behind a coordinator), takes the client's TTFT p50 minus the
workers' logged TTFT p50 and feeds it to `mindmotor simulate --frontend-overhead-ms`. The default
(`FRONTEND_OVERHEAD_S`) is the last such measurement documented (docs/emulator.md: 11.1 ms on
2026-12-03, the lowest of that day's runs on this shared 2-core machine, whose load only adds to
the path; 12.9 ms before, the median of three runs on 2026-12-02). 0.0 simulates the engines alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from mindmotor.common.roles import Role

ROUTING_POLICIES = ("round_robin", "least_load", "cache_aware", "weighted_round_robin")
FRONTEND_OVERHEAD_S = 0.0111           # the last measurement (see above); `--frontend-overhead-ms`


@dataclass(frozen=True)
class ClusterSpec:
    mixed: int = 1                       # instances serving whole requests
    prefill: int = 0                     # P/D split: prefill-only instances ...
    decode: int = 0                      # ... and decode instances
    device: str = "910B3"
    model: str = "qwen2-7b"              # profile name or a Hugging Face config.json
    tp: int = 1                          # cards per instance
    cards_per_node: int = 8              # KV moves over HCCS within a node, the inter-node link across
    routing: str = "least_load"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 16384
    block_size: int = 16
    memory_fraction: float = 0.8
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False  # the traces carry lengths, not contents
    frontend_overhead_s: float = FRONTEND_OVERHEAD_S  # serving path per request (measured; see above)
    kv_host_bytes: int = 0               # per instance: the KV host tier (engine/kv_tier.py); 0: none
    cache_chunk_size: int = 256 * 2**20  # its chunks (emulated bytes)
    prefetch_depth: int = 2              # its chunk copies in flight at once

    def __post_init__(self) -> None:
        if self.mixed < 0 or self.prefill < 0 or self.decode < 0:
            raise ValueError("instance counts must not be negative")
        if self.instances == 0:
            raise ValueError("the cluster has no instance")
        if (self.prefill == 0) != (self.decode == 0):
            raise ValueError("a P/D split needs both prefill and decode instances")
        if self.prefill and self.mixed:
            raise ValueError("a cluster is either mixed instances or a P/D split, not both")
        if self.routing not in ROUTING_POLICIES:
            raise ValueError(f"unknown routing policy {self.routing!r}; valid: {', '.join(ROUTING_POLICIES)}")
        if self.frontend_overhead_s < 0:
            raise ValueError(f"frontend_overhead_s must not be negative, got {self.frontend_overhead_s}")
        if self.kv_host_bytes < 0 or self.cache_chunk_size < 1 or self.prefetch_depth < 1:
            raise ValueError("kv_host_bytes must be >= 0, cache_chunk_size and prefetch_depth >= 1")
        if self.tp < 1 or self.cards_per_node < self.tp:
            raise ValueError(f"tp must be in [1, cards_per_node={self.cards_per_node}], got {self.tp}")

    @property
    def instances(self) -> int:
        return self.mixed + self.prefill + self.decode

    @property
    def cards(self) -> int:
        return self.instances * self.tp

    def roles(self) -> list[Role]:
        return [Role.PREFILL] * self.prefill + [Role.DECODE] * self.decode + [Role.MIXED] * self.mixed

    @classmethod
    def from_file(cls, path: str | Path, **overrides) -> "ClusterSpec":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read cluster description {path}: {exc}") from exc
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{path}: unknown fields {sorted(unknown)}; known: {sorted(known)}")
        return cls(**{**data, **overrides})
