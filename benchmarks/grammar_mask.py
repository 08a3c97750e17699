"""Host cost of structured outputs: the per-step time spent computing and applying the grammar
masks (llguidance, every row of the batch constrained by a JSON schema) against the whole step's
host time and the step's emulated device time (qwen2-7b on a 910B3), at decode batch 1, 32 and 128, on the bundled demo
model (4096-token vocabulary, its real tokenizer).

    python benchmarks/grammar_mask.py [--steps 20] [--out benchmarks/results/grammar_mask.json]
"""

from __future__ import annotations

import os

if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mindmotor import SamplingParams
from mindmotor.engine.config import EngineConfig
from mindmotor.engine.grammar import Constraint
from mindmotor.engine.llm_engine import LLMEngine

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "kind": {"enum": ["a", "b", "c"]},
    "items": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"},
                                                                            "note": {"type": "string"}}}}},
    "required": ["name", "kind", "items"]}


def measure(batch: int, steps: int, model: str | None = None, emulate: str = "qwen2-7b") -> dict:
    engine = LLMEngine(EngineConfig(model=model, max_num_seqs=max(batch, 1), timing="virtual", emulate=emulate))
    params = SamplingParams(max_tokens=steps + 8, temperature=1.0, seed=1,
                            structured=Constraint("json", json.dumps(SCHEMA)))
    for i in range(batch):
        engine.add_request(f"r{i}", f"record {i}:", params)
    engine.step()                                              # the prefill
    grammar = engine.grammar
    mask_ms, host_ms, emulated_ms = [], [], []
    for _ in range(steps):
        if not engine.has_unfinished_requests():
            break
        before_mask, before_emulated = grammar.mask_time_s, engine.device.pacer.emulated_time_s
        started = time.perf_counter()
        engine.step()
        host_ms.append((time.perf_counter() - started) * 1e3)
        mask_ms.append((grammar.mask_time_s - before_mask) * 1e3)
        emulated_ms.append((engine.device.pacer.emulated_time_s - before_emulated) * 1e3)
    mask, host, emu = statistics.median(mask_ms), statistics.median(host_ms), statistics.median(emulated_ms)
    return {"batch": batch, "steps": len(mask_ms), "mask_ms_median": round(mask, 3),
            "step_host_ms_median": round(host, 3), "step_emulated_ms_median": round(emu, 3),
            "mask_share_of_host_step": round(mask / host, 3), "mask_share_of_emulated_step": round(mask / emu, 3)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--model", default=None, help="checkpoint (default: the bundled demo model)")
    ap.add_argument("--emulate", default="qwen2-7b", help="the emulated model profile that prices a step")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = [measure(int(b), args.steps, args.model, args.emulate) for b in args.batches.split(",")]
    for row in rows:
        print(json.dumps(row))
    if args.out:
        Path(args.out).write_text(json.dumps({"grammar_mask": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
