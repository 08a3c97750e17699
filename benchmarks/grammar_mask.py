"""Host cost of structured outputs: the per-step time the sampler spends on the grammar masks
(llguidance, every row of the batch constrained by a JSON schema) against the whole step's host
time and the step's emulated device time (qwen2-7b on a 910B3), at decode batch 1, 32 and 128, on
the bundled demo model (4096-token vocabulary, its real tokenizer). Three ways, the same requests
and seeds each, rounds interleaved, medians:

- `baseline`: the masks computed when the sampler needs them, applied with np.unpackbits and
  np.where on the gathered rows (the way before);
- `sync`: computed when needed, applied with a byte → 8 biases table and one in-place add;
- `overlap` (what the engine does): computed on a background thread from before the forward pass
  (llguidance runs off the GIL), so the sampler only waits for what is left, then the table add.

`mask_ms` is the exposed host cost (what the step waits for); `compute_ms` the masks' computation
wherever it ran.

    python benchmarks/grammar_mask.py [--steps 20] [--rounds 3] [--out benchmarks/results/grammar_mask.json]
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

import numpy as np

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


WAYS = ("baseline", "sync", "overlap")


def unpack_masked(grammar, logits, rows, matchers) -> np.ndarray:
    """The baseline: the masks computed now, expanded bit by bit and applied with np.where."""
    bitmask = np.full((len(rows), grammar.words), -1, dtype=np.int32)
    grammar._fill(matchers, bitmask)
    allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :logits.shape[1]]
    idx = np.asarray(rows)
    logits = logits.copy()
    logits[idx] = np.where(allowed.astype(bool), logits[idx], -np.inf)
    return logits


def measure(batch: int, steps: int, model: str | None = None, emulate: str = "qwen2-7b",
            way: str = "overlap") -> dict:
    engine = LLMEngine(EngineConfig(model=model, max_num_seqs=max(batch, 1), timing="virtual", emulate=emulate))
    grammar = engine.grammar
    grammar.overlap = way == "overlap"
    if way == "baseline":
        grammar.masked = lambda logits, rows, matchers: unpack_masked(grammar, logits, rows, matchers)
    params = SamplingParams(max_tokens=steps + 8, temperature=1.0, seed=1,
                            structured=Constraint("json", json.dumps(SCHEMA)))
    for i in range(batch):
        engine.add_request(f"r{i}", f"record {i}:", params)
    engine.step()                                              # the prefill
    mask_ms, compute_ms, host_ms, emulated_ms = [], [], [], []
    for _ in range(steps):
        if not engine.has_unfinished_requests():
            break
        before = grammar.mask_time_s, grammar.compute_time_s, engine.device.pacer.emulated_time_s
        started = time.perf_counter()
        engine.step()
        host_ms.append((time.perf_counter() - started) * 1e3)
        mask_ms.append((grammar.mask_time_s - before[0]) * 1e3)
        compute_ms.append((grammar.compute_time_s - before[1]) * 1e3)
        emulated_ms.append((engine.device.pacer.emulated_time_s - before[2]) * 1e3)
    return {"batch": batch, "way": way, "steps": len(mask_ms), "mask_ms": statistics.median(mask_ms),
            "compute_ms": statistics.median(compute_ms), "step_host_ms": statistics.median(host_ms),
            "step_emulated_ms": statistics.median(emulated_ms)}


def summarize(runs: list[dict]) -> dict:
    """One batch size: each way's medians over the rounds, its exposed share of the emulated step,
    and the ratios to the baseline measured in the same run."""
    row: dict = {"batch": runs[0]["batch"], "steps": runs[0]["steps"], "rounds": len(runs) // len(WAYS)}
    for way in WAYS:
        mine = [r for r in runs if r["way"] == way]
        med = {k: statistics.median(r[k] for r in mine) for k in ("mask_ms", "compute_ms", "step_host_ms",
                                                                 "step_emulated_ms")}
        row[way] = {k: round(v, 3) for k, v in med.items()} | {
            "mask_share_of_emulated_step": round(med["mask_ms"] / med["step_emulated_ms"], 4),
            "mask_share_of_host_step": round(med["mask_ms"] / med["step_host_ms"], 4)}
    base = row["baseline"]["mask_ms"]
    row["exposed_vs_baseline"] = {way: round(row[way]["mask_ms"] / base, 3) for way in ("sync", "overlap")}
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved repeats of the three ways")
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--model", default=None, help="checkpoint (default: the bundled demo model)")
    ap.add_argument("--emulate", default="qwen2-7b", help="the emulated model profile that prices a step")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = []
    for b in args.batches.split(","):
        runs = [measure(int(b), args.steps, args.model, args.emulate, way)
                for _ in range(args.rounds) for way in WAYS]
        rows.append(summarize(runs))
        print(json.dumps(rows[-1]))
    if args.out:
        Path(args.out).write_text(json.dumps({"grammar_mask": rows}, indent=2) + "\n")
    print(json.dumps({"grammar_mask": [{"batch": r["batch"], "exposed_ms": r["overlap"]["mask_ms"],
                                        "share_of_emulated_step": r["overlap"]["mask_share_of_emulated_step"],
                                        "baseline_share": r["baseline"]["mask_share_of_emulated_step"]}
                                       for r in rows]}))


if __name__ == "__main__":
    main()
