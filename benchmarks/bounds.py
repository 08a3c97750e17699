"""What no scheduler can beat under the emulated device's cost model, so that a benchmark can say
how far a target lies from what is reachable at all — a number computed in the same run, not an
argument in prose.

Both bounds price the workload with `CostModel.operators` (per operator: compute time and memory
time; a step costs, per operator, the larger of the two plus its kernel launches).

`continuous_time_lower_bound`: the least emulated time in which any continuous-batching schedule
can serve a fixed set of requests (all present at t = 0) on one card. For every operator, the sum
over steps of max(compute, memory) is at least max(total compute, total memory); the totals are
fixed by the workload except the weights, which every step reads again, so

    T >= sum over operators of roofline(C_op, M_op + (S - 1) W_op) + S K

(the roofline is a k-norm, so the sum over steps of each step's roofline is at least the roofline
of the sums: Minkowski's inequality; the sharp max is the case k = infinity)

with C_op, M_op the compute and memory time of all the work merged into one step (chunking a
prompt leaves its attention FLOPs unchanged: sum c (p + c/2) = P^2 / 2), W_op the operator's
per-step fixed memory (its weights), K the fixed costs (launches, per-layer fixed costs, host
overhead) of the smallest step and S the fewest steps
possible: a request needs one step per output token; a step holds at most `max_num_seqs`
decoding sequences, at most `max_num_batched_tokens` tokens, and decoding sequences whose KV
contexts sum to at most the pool (so S >= sum of all decode contexts / pool tokens).

`prefill_ttft_floor`: a request's time to first token can be no shorter than its prompt's
prefill alone on an idle card.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mindmotor.device.cost_model import CostModel, StepShape


@dataclass(frozen=True)
class TimeBound:
    seconds: float
    min_steps: int
    output_tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


def continuous_time_lower_bound(cost_model: CostModel, lengths: list[tuple[int, int]], kv_pool_tokens: int,
                                max_num_seqs: int, max_num_batched_tokens: int) -> TimeBound:
    """`lengths`: (prompt tokens, output tokens) per request; the first output token is sampled
    by the prefill, each further one by a decode step whose context k includes the new token."""
    contexts = [p + j for p, o in lengths for j in range(1, o)]      # one per decode token
    total_tokens = sum(p for p, _ in lengths) + len(contexts)
    min_steps = max(max(o for _, o in lengths),
                    math.ceil(len(contexts) / max_num_seqs),
                    math.ceil(sum(contexts) / kv_pool_tokens),
                    math.ceil(total_tokens / max_num_batched_tokens))
    merged = cost_model.operators(StepShape(prefills=[(p, 0) for p, _ in lengths], decodes=contexts))
    fixed = _fixed_memory_per_step(cost_model)
    seconds = sum(op.roofline(op.compute_s if op.compute_floor_s is None else op.compute_floor_s,
                              op.memory_s + (min_steps - 1) * fixed.get(name, 0.0))
                  for name, op in merged.items())
    smallest_step = cost_model.operators(StepShape(decodes=[1]))
    seconds += min_steps * sum(op.fixed_s for op in smallest_step.values())
    return TimeBound(seconds=seconds, min_steps=min_steps, output_tokens=sum(o for _, o in lengths))


def _fixed_memory_per_step(cost_model: CostModel) -> dict[str, float]:
    """Per operator, the memory time a step pays whatever its size (the weights): every
    operator's memory time is linear in the step's tokens, so two one-token points give it."""
    one = cost_model.operators(StepShape(decodes=[1]))
    two = cost_model.operators(StepShape(decodes=[1, 1]))
    return {name: max(0.0, 2 * one[name].memory_s - two[name].memory_s) for name in one}


def prefill_ttft_floor(cost_model: CostModel, prompt_tokens: int) -> float:
    """Seconds to prefill `prompt_tokens` (nothing cached) in a step of its own."""
    return cost_model.step(StepShape(prefills=[(prompt_tokens, 0)])).seconds
