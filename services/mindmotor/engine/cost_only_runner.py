"""`CostOnlyRunner`: the engine's model runner without a model — for the simulator (and any run that
wants the emulated card's timing and nothing else).

It runs no forward pass and samples nothing: every sequence that samples this step gets
`PLACEHOLDER_TOKEN`. With fixed output lengths (`max_tokens`, no stop conditions) token values never
change what the scheduler does, so an engine with this runner schedules, batches, preempts, pins and
loads KV exactly as with the real one, and its steps cost what the device's `CostModel` charges for
the same `StepShape` (the engine prices each step on its `EmulatedDevice`; `LLMEngine.last_step_s`).

An engine with this runner has no weights and no tokenizer (`EngineConfig(runner="cost_only")`,
an emulated profile, prompts as token ids), so a request may not ask for what needs them — text
prompts, stop strings or tokens, bad words, logprobs, structured output (`unsupported`). Nothing
can then stop a request early: it ends at `max_tokens` (or the context), finish reason "length".

Its KV store (`NoKVCache`) holds block ids only; KV travels between engines (pinned prefill → waiting
continuation) as arrays with no layers, which still carry the block counts the engine checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mindmotor.device.cost_model import StepShape
from mindmotor.rules.sampling_params import SamplingParams

from .scheduler import ScheduledSequence, SchedulerOutput

PLACEHOLDER_TOKEN = 1


@dataclass
class CostOnlyInput:
    """What the engine needs of a step it did not compute: who samples, and the shape it costs."""
    sampling: list[ScheduledSequence]
    shape: StepShape
    prompt_spans: list = field(default_factory=list)     # no prompt logprobs without a model


class CostOnlyRunner:
    lora = None                       # lora_slots.LoraSlots when the engine serves adapters

    def run(self, out: SchedulerOutput) -> CostOnlyInput:
        """The step's `StepShape` and sampling sequences, in `ModelRunner.prepare`'s order (every
        decode first, then the prefill chunks)."""
        shape = StepShape()
        decodes, prefills = [], []
        for s in out.scheduled:
            if s.num_new_tokens == 1:
                decodes.append(s)
                shape.decodes.append(s.seq.num_computed_tokens + 1)
            else:
                prefills.append(s)
                shape.prefills.append((s.num_new_tokens, s.seq.num_computed_tokens))
        sampling = [s for s in decodes if s.samples] + [s for s in prefills if s.samples]
        if self.lora is not None:
            ordered = decodes + prefills
            shape.lora = self.lora.step_shape(ordered, [s.num_new_tokens for s in ordered])
        return CostOnlyInput(sampling, shape)

    @staticmethod
    def tokens(inp: CostOnlyInput) -> list[int]:
        return [PLACEHOLDER_TOKEN] * len(inp.sampling)


def unsupported(params: SamplingParams) -> tuple[str, str] | None:
    """(param, why) when a request asks for what a cost-only engine cannot give; None if it can run."""
    asks = [("stop", params.stop), ("stop_token_ids", params.stop_token_ids), ("bad_words", params.bad_words),
            ("logprobs", params.logprobs is not None), ("prompt_logprobs", params.prompt_logprobs is not None),
            ("structured_outputs", params.structured is not None)]
    for name, asked in asks:
        if asked:
            return name, (f"{name} needs the model and its tokenizer; this engine runs the cost-only runner "
                          "(placeholder tokens, fixed output lengths)")
    return None


class NoKVCache:
    """The KV store of an engine that computes nothing: block ids are handed out by the block
    manager as usual; the data has no layers (and so no bytes)."""

    num_layers = 0
    host_bytes = 0
    dtype = np.dtype(np.float32)

    def __init__(self, block_size: int, num_kv_heads: int, head_dim: int):
        self.block_size, self.num_kv_heads, self.head_dim = block_size, num_kv_heads, head_dim

    def ensure_blocks(self, max_block_id: int) -> None:
        pass

    def read_blocks(self, block_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        shape = (0, len(block_ids), self.block_size, self.num_kv_heads, self.head_dim)
        return np.zeros(shape, self.dtype), np.zeros(shape, self.dtype)

    def write_blocks(self, block_ids: list[int], k: np.ndarray, v: np.ndarray) -> None:
        pass
