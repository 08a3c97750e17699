"""Continuous batching vs static batching on the same requests (offline throughput).

Requests: prompt/output lengths drawn from the Azure LLM conversation trace 2023 (long-tailed),
clipped so that prompt + max_tokens fits a 4096-token context (output ≤ 1024, prompt ≤ 3072);
prompts are random token ids, generation ignores EOS so every request produces exactly its trace
output length. All requests are there at t = 0. The device is an emulated 910B3 serving the
`llama2-7b` profile: the KV pool and every step's time come from the roofline cost model.

- continuous: one `LLMEngine` gets every request; its scheduler fills each step's token and
  sequence budgets (chunked prefill, recompute preemption when blocks run out).
- static (the headline baseline): classic fixed-shape static batching. The same engine type,
  admissions gated by the driver: a batch is formed only when the engine is empty; it is one
  fixed-shape tensor, every row as long as the batch's longest prompt + max_tokens (the client's
  declared limit, default 1024 = the trace's maximum output, since a static server cannot know the
  real output length), so a batch holds at most floor(KV tokens / row) sequences (and
  max_num_seqs); it runs until its longest member finishes, with no admissions meanwhile. The
  padding is priced: the padding prompt tokens are prefilled, every decode row attends to them, and
  a finished member keeps its (padding) row until the batch ends.
- static_unpadded (second key): the same, but each row reserves only its own prompt + max_tokens
  and prompts are not padded (finished members still keep their rows) — a static baseline more
  generous than any fixed-shape server.

Both runs are priced by the same cost model in the same process; `throughput_ratio_emulated` is
output tokens per emulated second, continuous / static (padded);
`throughput_ratio_emulated_unpadded` the same against static_unpadded; `continuous_share_of_bound`
is continuous's throughput over the most any continuous schedule could reach on the same requests
and card (`benchmarks/bounds.py`, computed in the same run), reported for the emulated and the wall
run alike.
"""

from __future__ import annotations

import os

if __name__ == "__main__":
    # Before numpy loads: single-threaded OpenBLAS unless the caller set it. On this shared 2-core
    # machine the default threaded BLAS makes small matmuls erratic (see docs/benchmarks.md).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from mindmotor.device.cost_model import StepShape
from mindmotor.engine.config import EngineConfig
from mindmotor.engine.llm_engine import LLMEngine

from benchmarks.bounds import TimeBound, continuous_time_lower_bound
from benchmarks.common import (TRACE_CITATION, BenchRequest, DriverResult, VirtualClockDriver,
                               add_common_args, admit_all, benchmark_checkpoint, describe_model,
                               finish, log, mean, percentile, r3, r4, random_tokens,
                               sample_trace_lengths)

PROFILE = "llama2-7b"
DEVICE = "910B3"
MAX_MODEL_LEN = 4096


def make_requests(n: int, vocab_size: int, seed: int, max_output: int = 1024,
                  max_model_len: int = MAX_MODEL_LEN, length_scale: float = 1.0) -> list[BenchRequest]:
    rng = np.random.default_rng(seed)
    lengths = sample_trace_lengths(rng, n, max_model_len, max_output=max_output)
    reqs = []
    for i, (p, o) in enumerate(lengths):
        p = max(1, int(round(p * length_scale)))
        o = max(1, int(round(o * length_scale)))
        reqs.append(BenchRequest(f"req-{i}", random_tokens(rng, vocab_size, p), o, arrival_s=i * 1e-9,
                                 declared_max_tokens=max(1, int(round(max_output * length_scale)))))
    return reqs


STATIC_RESERVATIONS = ("max_tokens", "context", "oracle", "padded")


def static_policy(kv_tokens: int, block_size: int, max_num_seqs: int, reserve: str = "max_tokens",
                  max_model_len: int = MAX_MODEL_LEN):
    """Admit a batch only into an empty engine: the longest run of waiting requests whose
    block-rounded reservations fit. Reservation per sequence: prompt + the declared max_tokens
    ("max_tokens"), the whole context max_model_len ("context": max_tokens left unset), or
    prompt + the true output length ("oracle": a static server that knew the future), or the
    batch's longest prompt + the declared max_tokens ("padded": the batch is one fixed-shape
    tensor, every row as long as its longest prompt, as classic static batching runs it)."""
    if reserve not in STATIC_RESERVATIONS:
        raise ValueError(f"reserve must be one of {STATIC_RESERVATIONS}")

    def reservation(r: BenchRequest) -> int:
        if reserve == "context":
            tokens = max_model_len
        else:
            tokens = r.prompt_len + (r.output_len if reserve == "oracle" else r.declared_max_tokens)
        return -(-tokens // block_size) * block_size

    def padded_row(longest_prompt: int, r: BenchRequest) -> int:
        return -(-(longest_prompt + r.declared_max_tokens) // block_size) * block_size

    def admit(engine: LLMEngine, ready: list[BenchRequest]) -> int:
        if engine.has_unfinished_requests():
            return 0
        used = k = longest = 0
        for r in ready:
            if reserve == "padded":
                longest = max(longest, r.prompt_len)
                fits = (k + 1) * padded_row(longest, r) <= kv_tokens
            else:
                need = reservation(r)
                fits = used + need <= kv_tokens
            if k >= max_num_seqs or not fits:
                break
            used += 0 if reserve == "padded" else need
            k += 1
        if k == 0:
            raise RuntimeError(f"request {ready[0].request_id} needs {reservation(ready[0])} KV tokens; "
                               f"the pool has {kv_tokens}")
        return k
    return admit


def _engine(model_dir: str, seed: int, max_num_seqs: int, num_blocks: int | None) -> LLMEngine:
    return LLMEngine(EngineConfig(model=model_dir, device=DEVICE, emulate=PROFILE, timing="virtual",
                                  max_model_len=MAX_MODEL_LEN, max_num_seqs=max_num_seqs,
                                  num_blocks=num_blocks, seed=seed))


class StaticPadding:
    """Prices static batching as the fixed-shape batch it is on the card: a member that has finished
    keeps its row (a padding decode whose context keeps growing) until the batch's longest member
    finishes. Same cost model as the engine; the engine's own (unpadded) time is kept as well.

    With `pad_prompts`, every row is also as long as the batch's longest prompt: the padding
    tokens are prefilled with the batch's first step, and every decode row attends to its padding
    (the attention cost is linear in the context, so each row is charged the batch's mean padding)."""

    def __init__(self, engine: LLMEngine, pad_prompts: bool = False):
        self.cost_model = engine.device.cost_model
        self.pad_prompts = pad_prompts
        self.seconds = 0.0
        self.padding_rows = 0
        self.padding_prompt_tokens = 0
        self._done: dict[str, int] = {}   # finished member → context of its next padding row
        self._batch_padding = None        # padding tokens of the current batch's prompts

    def __call__(self, shape: StepShape, outputs, driver) -> None:
        prefills = list(shape.prefills)
        if self.pad_prompts and self._batch_padding is None:    # the batch's first step
            prompts = [len(seq.prompt_token_ids) for seq in driver.engine.requests.values()]
            longest = max(prompts, default=0)
            self._batch_padding = sum(longest - p for p in prompts)
            self._row_padding = self._batch_padding / max(1, len(prompts))   # mean per row
            self.padding_prompt_tokens += self._batch_padding
            prefills += [(longest - p, p) for p in prompts if longest > p]
        pad = list(self._done.values())
        self.padding_rows += len(pad)
        decodes = list(shape.decodes) + pad
        if self.pad_prompts and self._batch_padding:
            decodes = [k + round(self._row_padding) for k in decodes]
        self.seconds += self.cost_model.step(StepShape(prefills=prefills, decodes=decodes)).seconds
        for rid in self._done:
            self._done[rid] += 1
        for out in outputs:
            if out.finished:
                self._done[out.request_id] = out.num_prompt_tokens + out.num_output_tokens + 1
        if not driver.engine.has_unfinished_requests():   # the batch is over
            self._done.clear()
            self._batch_padding = None


def _summary(res: DriverResult, engine: LLMEngine, emulated_s: float | None = None) -> dict:
    tokens = res.output_tokens
    emulated_s = res.emulated_busy_s if emulated_s is None else emulated_s
    st = engine.stats()
    return {
        "output_tokens": tokens,
        "emulated_s": r4(emulated_s),
        "wall_s": r3(res.wall_s),
        "tok_per_emulated_s": r3(tokens / emulated_s),
        "tok_per_wall_s": r3(tokens / res.wall_s),
        "steps": res.steps,
        "mean_seqs_per_sampling_step": r3(mean([n for n in res.step_num_seqs if n])),
        "max_seqs_per_step": max(res.step_num_seqs) if res.step_num_seqs else 0,
        "preemptions": st.num_preemptions,
        "prompt_tokens_computed": st.prompt_tokens,
    }


STATIC_MODES = {"static": "padded", "static_unpadded": "max_tokens", "static_context": "context",
                "static_oracle": "oracle"}


def compare(requests: list[BenchRequest], model_dir: str, seed: int, *, max_num_seqs: int = 256,
            num_blocks: int | None = None, run_model: bool = True, variants: bool = False,
            progress: bool = True, tag: str = "") -> dict:
    """Continuous vs static (classic padded: the headline) and static_unpadded; with `variants`,
    also static reserving the whole context and static with oracle reservations (both unpadded)."""
    modes = ["continuous", "static", "static_unpadded"] + (["static_context", "static_oracle"]
                                                           if variants else [])
    results, engines, padders = {}, {}, {}
    for name in modes:
        engine = _engine(model_dir, seed, max_num_seqs, num_blocks)
        bm = engine.block_manager
        if name == "continuous":
            policy, padder = admit_all, None
        else:
            reserve = STATIC_MODES[name]
            policy = static_policy(bm.num_blocks * bm.block_size, bm.block_size, max_num_seqs,
                                   reserve=reserve, max_model_len=engine.max_model_len)
            padder = StaticPadding(engine, pad_prompts=reserve == "padded")
        t = time.perf_counter()
        res = VirtualClockDriver(engine, requests, admit=policy, progress=progress,
                                 desc=f"{tag}{name}", run_model=run_model, on_step=padder).run()
        engine.check_invariants()
        results[name], engines[name], padders[name] = res, engine, padder
        emu = padder.seconds if padder else res.emulated_busy_s
        log(f"[batching] {tag}{name}: {res.output_tokens} tokens in {emu:.2f} emulated s "
            f"({res.output_tokens / emu:.0f} tok/s; engine's own {res.emulated_busy_s:.2f} s), "
            f"{res.steps} steps, wall {time.perf_counter() - t:.1f} s")

    cont = results["continuous"]
    cont_tps = cont.output_tokens / cont.emulated_busy_s
    cont_wall_tps = cont.output_tokens / cont.wall_s
    bound = _continuous_bound(engines["continuous"], requests)

    def tps(name: str) -> float:
        return results[name].output_tokens / padders[name].seconds

    def wall_tps(name: str) -> float:
        return results[name].output_tokens / results[name].wall_s

    out = {
        "num_requests": len(requests),
        "ran_model": run_model,
        "continuous_tok_per_emulated_s": r3(cont_tps),
        "static_tok_per_emulated_s": r3(tps("static")),
        "static_unpadded_tok_per_emulated_s": r3(tps("static_unpadded")),
        "throughput_ratio_emulated": r3(cont_tps / tps("static")),
        "throughput_ratio_emulated_unpadded": r3(cont_tps / tps("static_unpadded")),
        "throughput_ratio_wall": r3(cont_wall_tps / wall_tps("static")),
        "throughput_ratio_wall_unpadded": r3(cont_wall_tps / wall_tps("static_unpadded")),
        # the most any continuous schedule could reach on this workload and card (benchmarks/bounds.py)
        "continuous_bound_tok_per_emulated_s": r3(bound.tokens_per_s),
        "continuous_share_of_bound": r3(cont_tps / bound.tokens_per_s),
        "throughput_ratio_bound": r3(bound.tokens_per_s / tps("static")),
        "throughput_ratio_bound_unpadded": r3(bound.tokens_per_s / tps("static_unpadded")),
        "bound_min_steps": bound.min_steps,
        "continuous": _summary(cont, engines["continuous"]),
        "kv_pool_tokens": engines["continuous"].block_manager.num_blocks * engines["continuous"].block_manager.block_size,
    }
    for name in modes[1:]:
        res, pad = results[name], padders[name]
        out[name] = {**_summary(res, engines[name], pad.seconds),
                     "emulated_s_unpadded": r4(res.emulated_busy_s),   # finished rows free, no padding
                     "padding_rows": pad.padding_rows,
                     "padding_prompt_tokens": pad.padding_prompt_tokens,
                     "num_batches": len(res.batch_sizes), "batch_size_mean": r3(mean(res.batch_sizes)),
                     "batch_size_min": min(res.batch_sizes), "batch_size_max": max(res.batch_sizes),
                     "reserved_max_tokens": requests[0].declared_max_tokens,
                     "throughput_ratio_emulated": r3(cont_tps / tps(name)),
                     "throughput_ratio_bound": r3(bound.tokens_per_s / tps(name)),
                     "throughput_ratio_emulated_vs_unpadded": r3(
                         cont_tps / (res.output_tokens / res.emulated_busy_s))}
    return out


def _continuous_bound(engine: LLMEngine, requests: list[BenchRequest]) -> TimeBound:
    bm = engine.block_manager
    return continuous_time_lower_bound(engine.device.cost_model, [(r.prompt_len, r.output_len) for r in requests],
                                       kv_pool_tokens=bm.num_blocks * bm.block_size,
                                       max_num_seqs=engine.config.max_num_seqs,
                                       max_num_batched_tokens=engine.config.max_num_batched_tokens)


def _length_stats(requests: list[BenchRequest]) -> dict:
    p = [r.prompt_len for r in requests]
    o = [r.output_len for r in requests]
    return {"prompt_tokens_total": sum(p), "output_tokens_total": sum(o),
            "prompt_mean": r3(mean(p)), "prompt_p50": percentile(p, 50), "prompt_p99": percentile(p, 99),
            "prompt_max": max(p), "output_mean": r3(mean(o)), "output_p50": percentile(o, 50),
            "output_p99": percentile(o, 99), "output_max": max(o)}


def run(num_requests: int = 500, seed: int = 0, model: str | None = None, max_output: int = 1024,
        max_num_seqs: int = 256, variants: bool = True, wall_requests: int = 500,
        wall_scale: float = 0.25, progress: bool = True) -> dict:
    """Two measurements in one process:

    1. emulated (the headline): `num_requests` requests at the trace's lengths, stepped with
       `step_without_model` (the engine's scheduler, block manager, input preparation,
       postprocessing and cost model; no numpy forward, which does not change emulated time);
    2. wall: the whole engine (numpy model included) on `wall_requests` requests whose prompt and
       output lengths, and the KV pool, are scaled by `wall_scale` (so batch sizes stay those of
       the trace-scale run) — the host cannot run the full-length workload in minutes. Its own
       emulated ratio is reported as a cross-check.
    """
    model_dir = benchmark_checkpoint(model, seed)
    probe = _engine(model_dir, seed, max_num_seqs, None)
    vocab = probe.model.config.vocab_size
    pool_blocks = probe.block_manager.num_blocks
    requests = make_requests(num_requests, vocab, seed, max_output=max_output)
    log(f"[batching] emulated part: {num_requests} requests, prompt mean "
        f"{mean([r.prompt_len for r in requests]):.0f}, output mean "
        f"{mean([r.output_len for r in requests]):.0f} tokens; KV pool {pool_blocks * 16} tokens "
        f"({PROFILE} on {DEVICE})")
    emulated = compare(requests, model_dir, seed, max_num_seqs=max_num_seqs, run_model=False,
                       variants=variants, progress=progress, tag="emulated/")

    wall_reqs = make_requests(wall_requests, vocab, seed, max_output=max_output, length_scale=wall_scale)
    wall_blocks = max(1, int(pool_blocks * wall_scale))
    log(f"[batching] wall part: {wall_requests} requests at {wall_scale}x length, KV pool "
        f"{wall_blocks} blocks, numpy model running")
    wall = compare(wall_reqs, model_dir, seed, max_num_seqs=max_num_seqs, num_blocks=wall_blocks,
                   run_model=True, progress=progress, tag="wall/")

    return {
        "benchmark": "batching",
        "num_requests": num_requests,
        "continuous_tok_per_emulated_s": emulated["continuous_tok_per_emulated_s"],
        "static_tok_per_emulated_s": emulated["static_tok_per_emulated_s"],
        "static_unpadded_tok_per_emulated_s": emulated["static_unpadded_tok_per_emulated_s"],
        "throughput_ratio_emulated": emulated["throughput_ratio_emulated"],
        "throughput_ratio_emulated_unpadded": emulated["throughput_ratio_emulated_unpadded"],
        "throughput_ratio_wall": wall["throughput_ratio_wall"],
        "target_ratio": 4.0,
        "continuous_share_of_bound": emulated["continuous_share_of_bound"],
        "continuous_share_of_bound_wall_run": wall["continuous_share_of_bound"],
        "continuous_bound_tok_per_emulated_s": emulated["continuous_bound_tok_per_emulated_s"],
        "throughput_ratio_bound": emulated["throughput_ratio_bound"],
        "throughput_ratio_bound_unpadded": emulated["throughput_ratio_bound_unpadded"],
        "emulated_run": emulated,
        "wall_run": {**wall, "length_scale": wall_scale, "kv_blocks": wall_blocks,
                     "requests": _length_stats(wall_reqs)},
        "requests": {**_length_stats(requests), "max_output": max_output, "source": TRACE_CITATION},
        "setup": {**describe_model(probe, model), "max_num_seqs": max_num_seqs,
                  "max_num_batched_tokens": probe.config.max_num_batched_tokens,
                  "timing": "virtual (emulated 910B time from the roofline cost model)", "seed": seed},
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap)
    ap.add_argument("--num-requests", type=int, default=None, help="default 500 (120 with --quick)")
    ap.add_argument("--wall-requests", type=int, default=None,
                    help="requests of the wall-clock run (default 500; 60 with --quick)")
    ap.add_argument("--wall-scale", type=float, default=None,
                    help="length and KV-pool scale of the wall-clock run (default 0.25; 0.0625 with --quick)")
    ap.add_argument("--max-output", type=int, default=1024,
                    help="output clip and the max_tokens static batching reserves (default 1024)")
    ap.add_argument("--no-variants", action="store_true",
                    help="skip the static variants (reserve the whole context; reserve the true output)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    n = args.num_requests or (120 if args.quick else 500)
    result = run(num_requests=n, seed=args.seed, model=args.model, max_output=args.max_output,
                 variants=not args.no_variants, progress=not args.no_progress,
                 wall_requests=args.wall_requests or (60 if args.quick else 500),
                 wall_scale=args.wall_scale or (0.0625 if args.quick else 0.25))
    result["quick"] = bool(args.quick)
    finish(result, args.save_json)
    return result


if __name__ == "__main__":
    main()
