"""`ModelRunner`: turns a `SchedulerOutput` into the flat arrays the model takes, runs it, and
returns the logits of the sequences that sample this step.

Layout of a step (the order `AttentionMetadata` expects): every sequence with exactly one new
token first (decodes), then the prefill chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mindmotor.device.cost_model import StepShape
from mindmotor.model.attention import AttentionMetadata
from mindmotor.model.decode_kv import DecodeKV
from mindmotor.model.kv_cache import PagedKVCache
from mindmotor.model.llama import LlamaModel

from .scheduler import ScheduledSequence, SchedulerOutput
from .sequence import token_slice


@dataclass
class ModelInput:
    input_ids: np.ndarray        # [num_tokens]
    positions: np.ndarray        # [num_tokens]
    meta: AttentionMetadata
    logits_indices: np.ndarray   # [num_sampling]: the row of each sampling sequence's last token
    sampling: list[ScheduledSequence]
    shape: StepShape             # what the emulated device charges for
    # after the sampling rows: the logits of prompt positions, for prompt_logprobs — (sequence,
    # first position, count); position p's row predicts prompt token p + 1
    prompt_spans: list[tuple[ScheduledSequence, int, int]] = field(default_factory=list)
    ordered: list[ScheduledSequence] = field(default_factory=list)   # in row order (decodes first)


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: PagedKVCache):
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.lora = None              # lora_slots.LoraSlots when the engine serves adapters
        self.decode_kv = DecodeKV(kv_cache)   # the decodes' K/V, contiguous, kept across steps

    def run(self, out: SchedulerOutput) -> tuple[np.ndarray, ModelInput]:
        """→ logits [num_sampling + prompt rows, vocab] and the input it was computed from."""
        inp = self.prepare(out)
        self.kv_cache.ensure_blocks(int(inp.meta.slot_mapping.max()) // self.block_size)
        meta = inp.meta
        if meta.num_decodes:
            tables, _ = meta.decode_plan(self.block_size, None)
            if self.decode_kv.prepare([s.seq for s in inp.ordered[:meta.num_decodes]],
                                      meta.context_lens[:meta.num_decodes], tables):
                meta.decode_kv = self.decode_kv
        else:
            self.decode_kv.reset()
        lora = None
        if self.lora is not None:
            lora = self.lora.batch(inp.ordered, [s.num_new_tokens for s in inp.ordered])
        logits = self.model.forward(inp.input_ids, inp.positions, inp.meta, self.kv_cache,
                                    inp.logits_indices, lora)
        return logits, inp

    def prepare(self, out: SchedulerOutput) -> ModelInput:
        bs = self.block_size
        decodes = [s for s in out.scheduled if s.num_new_tokens == 1]
        prefills = [s for s in out.scheduled if s.num_new_tokens > 1]
        ordered = decodes + prefills
        num_seqs = len(ordered)

        input_ids: list[int] = []
        positions: list[np.ndarray | int] = []
        slots: list[np.ndarray | int] = []
        query_start = np.zeros(num_seqs + 1, dtype=np.int64)
        context_lens = np.empty(num_seqs, dtype=np.int64)
        max_blocks = max(len(s.seq.block_table) for s in ordered)
        block_tables = np.zeros((num_seqs, max_blocks), dtype=np.int64)
        logits_indices, sampling = [], []
        prompt_rows, prompt_spans = [], []
        shape = StepShape()

        for i, s in enumerate(ordered):
            seq, start, n = s.seq, s.seq.num_computed_tokens, s.num_new_tokens
            table = seq.block_table
            block_tables[i, :len(table)] = table   # NO_BLOCK (-1, out of the window) gathers the
                                                   # last host block: masked, never read into a result
            input_ids.extend(token_slice(seq, start, start + n))
            if n == 1:
                positions.append(start)
                slots.append(table[start // bs] * bs + start % bs)
                shape.decodes.append(start + 1)
            else:
                pos = np.arange(start, start + n)
                positions.append(pos)
                slots.append(np.asarray(table)[pos // bs] * bs + pos % bs)
                shape.prefills.append((n, start))
            query_start[i + 1] = query_start[i] + n
            context_lens[i] = start + n
            if s.samples:
                logits_indices.append(query_start[i + 1] - 1)
                sampling.append(s)
            if seq.needs_prompt_logits:
                first = max(start, len(seq.prompt_logprobs))
                last = min(start + n, seq.num_prompt_tokens - 1)
                if last > first:
                    prompt_rows.extend(range(query_start[i] + first - start, query_start[i] + last - start))
                    prompt_spans.append((s, first, last - first))

        if self.lora is not None:
            shape.lora = self.lora.step_shape(ordered, [s.num_new_tokens for s in ordered])
        meta = AttentionMetadata(
            slot_mapping=_flatten(slots), query_start_loc=query_start, context_lens=context_lens,
            block_tables=block_tables, num_decodes=len(decodes))
        return ModelInput(input_ids=np.asarray(input_ids, dtype=np.int64), positions=_flatten(positions),
                          meta=meta, logits_indices=np.asarray(logits_indices + prompt_rows, dtype=np.int64),
                          sampling=sampling, shape=shape, prompt_spans=prompt_spans,
                          ordered=ordered)


def _flatten(parts: list) -> np.ndarray:
    """Scalars (decodes) and arrays (prefills) into one int64 array, in order."""
    return np.concatenate([np.atleast_1d(np.asarray(p, dtype=np.int64)) for p in parts]) \
        if any(isinstance(p, np.ndarray) for p in parts) else np.asarray(parts, dtype=np.int64)
