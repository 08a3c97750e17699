"""`StepBudget`: what one scheduler step may still compute, and how large a prefill chunk fits in it.

A step is bounded two ways, so that its time — and with it how long a decode waits for its next
token — does not grow with the prompts that happen to be prefilling:

- tokens (`max_num_batched_tokens`): every scheduled token, decodes and prefill chunks alike, as
  in vLLM; and at most `long_prefill_token_threshold` new tokens of one prefill (0: no cap);
- prefill attention (`max_num_batched_attention`, 0: no limit): the query–key pairs the step's
  prefill chunks compute. A chunk of c new tokens after p computed ones computes
  `c·p + c·(c+1)/2` of them (each new token attends to every earlier token and itself), so the
  same number of tokens costs more the deeper into a long prompt it is. On an accelerator the
  token count dominates; in the numpy model attention does beyond a few hundred tokens of context
  (docs/benchmarks.md, "Fair prefill"), which is why the worker bounds it — by default to
  `host_attention_budget(model)`: its cost is one score per pair, query head and layer, so the
  same host time buys fewer pairs of a bigger model. (A sliding window makes a deep chunk's
  attention cheaper than the count says: the budget is then conservative.)

A decode (one token) is never limited by the attention budget: the budget exists to protect decodes.
When the attention budget leaves no room for even one token at a chunk's depth, the step's first
prefill chunk still gets one token, so every prompt always makes progress.

Classes (`lower_class_tokens`, the scheduler's `lower_class_prefill_tokens`; 0: off): in a step
that already holds a sequence of a more urgent priority (lower number), the prefill chunks of less
urgent sequences together get at most that many tokens — a batch prompt's chunk cannot stretch the
step that carries an interactive prompt's first token or an interactive stream's next one. A step
with one class only is not limited by it, nor is a step without chunked prefill.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


# Attention scores (query–key pairs × query heads × layers) one step's prefill may compute when the
# worker sizes the budget from the served model: about 30 ms of the numpy kernel on one core of the
# 2-core benchmark machine (~8 ns a score); 131,072 pairs of the bundled 8-head, 4-layer model.
HOST_ATTENTION_SCORES_PER_STEP = 2 ** 22


def host_attention_budget(num_attention_heads: int, num_hidden_layers: int) -> int:
    """`max_num_batched_attention` of the same host cost for any model: query–key pairs per step."""
    return max(1, HOST_ATTENTION_SCORES_PER_STEP // (num_attention_heads * num_hidden_layers))


def attention_pairs(num_new: int, num_computed: int) -> int:
    """Query–key pairs of causal attention for `num_new` tokens after `num_computed` ones."""
    return num_new * num_computed + num_new * (num_new + 1) // 2


def max_tokens_within(pairs: int, num_computed: int) -> int:
    """The most new tokens after `num_computed` ones whose attention fits in `pairs`."""
    if pairs <= 0:
        return 0
    b = 2 * num_computed + 1                  # attention_pairs(c, p) <= A  <=>  c² + b·c − 2A <= 0
    c = (math.isqrt(b * b + 8 * pairs) - b) // 2
    while attention_pairs(c + 1, num_computed) <= pairs:   # isqrt rounds down: at most a step off
        c += 1
    while c > 0 and attention_pairs(c, num_computed) > pairs:
        c -= 1
    return c


@dataclass
class StepBudget:
    tokens: int                              # left for this step
    attention_limit: int | None = None       # prefill query–key pairs per step; None: no limit
    chunk_tokens: int = 0                    # long_prefill_token_threshold; 0: no cap
    chunked: bool = True                     # without chunked prefill a prompt fits whole or waits
    attention_spent: int = 0                 # by this step's prefill chunks so far
    lower_class_tokens: int = 0              # prefill tokens of sequences less urgent than the step's most
                                             # urgent one; 0: no cap
    lower_class_spent: int = 0
    top_priority: int | None = 0             # the most urgent priority this step holds so far (0: the default
                                             # class; less urgent ones are background work, always capped)
    _charged: dict[int, tuple[int, int, int]] = field(default_factory=dict)   # id(seq) → (tokens, pairs, lower)

    def num_new_tokens(self, num_remaining: int, num_computed: int, priority: int | None = None) -> int:
        """How many of a sequence's `num_remaining` uncomputed tokens (after `num_computed`) this
        step can take; 0: none. `priority`: the sequence's (for the lower-class cap)."""
        if num_remaining <= 1:                               # a decode, or a prompt's last token
            return min(num_remaining, self.tokens)
        if not self.chunked:                 # (the lower-class cap needs chunks: a prompt could never fit)
            return num_remaining if num_remaining <= self.tokens else 0
        n = min(num_remaining, self.tokens)
        if self._lower(priority):
            n = min(n, self.lower_class_tokens - self.lower_class_spent)
        if self.chunk_tokens:
            n = min(n, self.chunk_tokens)
        if self.attention_limit is not None:
            fit = max_tokens_within(self.attention_limit - self.attention_spent, num_computed)
            if fit == 0 and self.attention_spent == 0:       # a lone chunk always progresses
                fit = 1
            n = min(n, fit)
        return max(n, 0)

    def _lower(self, priority: int | None) -> bool:
        return bool(self.lower_class_tokens) and priority is not None and self.top_priority is not None \
            and priority > self.top_priority

    def take(self, seq, num_new: int, num_computed: int, prefill: bool) -> None:
        """Charge `num_new` tokens of `seq` (a prefill chunk's attention too)."""
        pairs = attention_pairs(num_new, num_computed) if prefill and self.chunked else 0
        lower = num_new if prefill and self.chunked and self._lower(seq.priority) else 0
        self.tokens -= num_new
        self.attention_spent += pairs
        self.lower_class_spent += lower
        if self.top_priority is None or seq.priority < self.top_priority:
            self.top_priority = seq.priority
        self._charged[id(seq)] = (num_new, pairs, lower)

    def refund(self, seq) -> int:
        """Give back what `seq` was charged (it was preempted after being scheduled); its tokens."""
        num_new, pairs, lower = self._charged.pop(id(seq), (0, 0, 0))
        self.tokens += num_new
        self.attention_spent -= pairs
        self.lower_class_spent -= lower
        return num_new
