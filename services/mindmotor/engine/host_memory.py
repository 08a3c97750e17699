"""The host memory budget of a worker's KV storage.

The emulated card decides how many KV blocks the scheduler may use (`num_blocks`); this budget
decides how many of them may have host arrays at once. By default it is `DEFAULT_FRACTION` of the
machine's memory (the cgroup limit when that is lower, as in a container), so that an emulated card
with far more KV than the host has RAM cannot fill the host with prefix-cache blocks.

    budget = resolve_budget(config.kv_host_budget_bytes)      # None: the default fraction
    parse_size("2GiB"), parse_size("512M"), parse_size("25%")  # bytes (a percentage: of the machine)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

DEFAULT_FRACTION = 0.10          # of the machine's memory, per worker
TIER_FRACTION = 0.05             # the KV host tier's default (`--kv-host-bytes`), per worker
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30,
          "gib": 2**30, "ti": 2**40, "tib": 2**40}
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def machine_memory_bytes() -> int:
    """Physical memory (MemTotal), or the cgroup's memory limit when that is lower."""
    total = _mem_total()
    for path in _CGROUP_LIMITS:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total


def _mem_total() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_tier_bytes() -> int:
    """The KV host tier's default budget (engine/kv_tier.py): `TIER_FRACTION` of the machine."""
    return int(machine_memory_bytes() * TIER_FRACTION)


def default_budget() -> int:
    return int(machine_memory_bytes() * DEFAULT_FRACTION)


def resolve_budget(budget_bytes: int | None) -> int:
    return default_budget() if budget_bytes is None else int(budget_bytes)


def parse_size(text: str) -> int:
    """"2GiB", "512M", "1.5g", "1048576" → bytes; "25%" → that share of `machine_memory_bytes()`.
    ValueError for anything else."""
    value = str(text).strip().lower().replace(" ", "")
    if value.endswith("%"):
        percent = float(value[:-1])
        if not 0 < percent <= 100:
            raise ValueError(f"a percentage of the machine's memory must be in (0, 100], got {text!r}")
        return int(machine_memory_bytes() * percent / 100)
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)([a-z]*)", value)
    if not match or match.group(2) not in _UNITS:
        raise ValueError(f"not a size: {text!r} (expected e.g. 2GiB, 512MiB, 1G, 1048576 or 25%)")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def format_bytes(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"
