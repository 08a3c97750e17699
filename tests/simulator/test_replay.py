"""One engine everywhere: a small fixed trace replayed through `mindmotor simulate`'s path and
through a directly driven `LLMEngine` loop (`engine.step()` over and over, what a worker's engine
thread does) with the same cost-only runner and a virtual clock gives every request the same
first-token and finish times in emulated time."""

from __future__ import annotations

from mindmotor.engine.llm_engine import LLMEngine
from mindmotor.simulator import ClusterSpec, TraceRequest, simulate
from mindmotor.simulator.instance import SimRequest, engine_config

# (arrival s, prompt tokens, output tokens): bursts and gaps, long prompts that need several
# chunks, one-token outputs, requests arriving while the engine is busy and while it is idle.
TRACE = [TraceRequest(*t) for t in [
    (0.00, 620, 12), (0.01, 40, 30), (0.01, 300, 1), (0.02, 900, 8), (0.05, 120, 25), (0.05, 75, 40),
    (0.08, 510, 3), (0.09, 33, 60), (0.12, 700, 20), (0.15, 64, 16), (0.15, 64, 16), (0.18, 250, 5),
    (0.30, 820, 2), (0.31, 18, 45), (0.33, 440, 33), (0.40, 95, 9), (0.41, 600, 14), (0.47, 128, 1),
    (0.52, 380, 27), (0.60, 50, 50), (2.00, 410, 6), (2.00, 410, 6), (2.01, 760, 18), (2.05, 20, 70),
    (2.10, 333, 11), (2.20, 555, 4), (2.21, 99, 35), (2.25, 640, 22), (2.40, 170, 13), (2.41, 45, 41),
    (5.00, 880, 10), (5.02, 260, 24), (5.03, 310, 7), (5.05, 72, 52), (5.20, 490, 19), (5.21, 150, 28),
]]
SPEC = ClusterSpec(mixed=1, device="910B3", model="llama2-7b", max_num_batched_tokens=512, max_num_seqs=12,
                   max_model_len=1024, frontend_overhead_s=0.0129)
NUM_BLOCKS = 70                     # small: preemptions happen


def engine_loop(spec: ClusterSpec, trace: list[TraceRequest]) -> tuple[dict, LLMEngine]:
    """The engine path: admit what has arrived, step, move the clock by the step's emulated time."""
    clock = [0.0]
    engine = LLMEngine(engine_config(spec, NUM_BLOCKS), clock=lambda: clock[0])
    pending = [SimRequest(i, t.arrival_s, t.prompt_tokens, t.output_tokens) for i, t in enumerate(trace)]
    times: dict[str, list] = {}
    while pending or engine.has_unfinished_requests():
        while pending and pending[0].arrival_s + spec.frontend_overhead_s <= clock[0]:
            req = pending.pop(0)
            engine.add_request(req.request_id, req.prompt_token_ids(engine.vocab_size), req.params(),
                               arrival_time=req.arrival_s)
        if not engine.has_unfinished_requests():
            clock[0] = pending[0].arrival_s + spec.frontend_overhead_s      # idle until the next arrival
            continue
        outputs = engine.step()
        clock[0] += engine.last_step_s
        for out in outputs:
            t = times.setdefault(out.request_id, [None, None])
            if t[0] is None:
                t[0] = clock[0]
            if out.finished:
                assert out.finish_reason == "length"
                t[1] = clock[0]
    return times, engine


def test_simulate_and_the_engine_loop_agree_request_for_request():
    sim = simulate(SPEC, TRACE, num_blocks=NUM_BLOCKS)
    loop, engine = engine_loop(SPEC, TRACE)
    assert sim.clipped == 0 and len(loop) == len(TRACE)
    for req in sim.requests:
        first, finished = loop[req.request_id]
        assert req.first_token_s == first, req.index                    # the same float operations
        assert req.finished_s == finished, req.index
    inst = sim.instances[0]
    assert inst.steps == engine.steps and inst.scheduler.num_preemptions == engine.scheduler.num_preemptions > 0
