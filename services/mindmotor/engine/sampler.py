"""`Sampler`: logits → next tokens, one row per sequence.

Penalties (presence/frequency over the tokens generated so far, as OpenAI defines them), min_tokens
(stop tokens masked until enough are out), repetition_penalty, logit_bias, allowed_token_ids and
bad_words, then greedy, or temperature → min_p → top-k → top-p → a draw from
the sequence's own generator (seeded per request, so a seed reproduces regardless of the batch).
Logprobs are those of the model's raw distribution, as OpenAI reports them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .sequence import Sequence


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first
    rank: int | None = None       # 1 + how many tokens are more likely (prompt tokens only)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


class Sampler:
    def __init__(self, eos_token_ids: tuple[int, ...] = (), grammar=None):
        self.eos_token_ids = tuple(eos_token_ids)
        self.grammar = grammar               # a GrammarEngine, for the rows with a structured output

    @staticmethod
    def skip_draws(seq: Sequence, num_tokens: int) -> None:
        """Advance `seq`'s generator past `num_tokens` tokens sampled elsewhere (another instance
        drew them from the same seed): a non-greedy token costs exactly one uniform draw
        (`Generator.choice` with `p`), a greedy one none."""
        if not seq.params.greedy:
            seq.rng.random(num_tokens)

    def __call__(self, logits: np.ndarray, seqs: list[Sequence]) -> tuple[list[int], list[TokenLogprob | None]]:
        """logits: [num_seqs, vocab] float32 → a token and (when asked) its logprobs per sequence.
        Raises the first row's error, if any (see `sample`)."""
        tokens, logprobs, errors = self.sample(logits, seqs)
        if errors:
            raise next(iter(errors.values()))
        return tokens, logprobs

    def sample(self, logits: np.ndarray, seqs: list[Sequence]
               ) -> tuple[list[int], list[TokenLogprob | None], dict[int, Exception]]:
        """As `__call__`, each row on its own: a row whose sampling raises (its logits are not
        finite, ...) is returned in the errors (row -> exception; its token is -1) and the other
        rows are sampled as if it were not there (every row draws from its own generator)."""
        raw = logits
        errors: dict[int, Exception] = {}
        logits = self._apply_penalties_and_masks(logits, seqs, errors)
        logits = self._apply_grammars(logits, seqs, errors)
        tokens = np.full(len(seqs), -1, dtype=np.int64)
        greedy = np.array([s.params.greedy and i not in errors for i, s in enumerate(seqs)], dtype=bool)
        if greedy.any():
            tokens[greedy] = logits[greedy].argmax(axis=-1)
        for i in np.flatnonzero(~greedy):
            if i in errors:
                continue
            try:
                tokens[i] = self._sample_row(logits[i], seqs[i])
            except Exception as exc:  # noqa: BLE001 - this row's request fails alone
                errors[int(i)] = exc
        logprobs: list[TokenLogprob | None] = []
        for i, s in enumerate(seqs):
            lp = None
            if s.params.logprobs is not None and i not in errors:
                try:
                    lp = self._logprobs(raw[i], int(tokens[i]), s.params.logprobs)
                except Exception as exc:  # noqa: BLE001
                    errors[i] = exc
            logprobs.append(lp)
        return tokens.tolist(), logprobs, errors

    def _apply_penalties_and_masks(self, logits: np.ndarray, seqs: list[Sequence],
                                   errors: dict[int, Exception]) -> np.ndarray:
        copied = False
        for i, seq in enumerate(seqs):
            p = seq.params
            penalize = bool((p.presence_penalty or p.frequency_penalty) and seq.output_token_ids)
            mask_stops = seq.num_output_tokens < p.min_tokens
            shape = bool(p.repetition_penalty != 1.0 or p.logit_bias or p.allowed_token_ids is not None
                         or p.bad_words_token_ids)
            if not (penalize or mask_stops or shape):
                continue
            if not copied:
                logits, copied = logits.copy(), True
            try:
                self._penalize_row(logits, i, seq, penalize, mask_stops)
                if shape:
                    self._shape_row(logits, i, seq)
            except Exception as exc:  # noqa: BLE001 - this row's request fails alone
                errors[i] = exc
        return logits

    def prefetch_masks(self, seqs: list[Sequence]) -> None:
        """Start the grammar masks of the constrained `seqs` (a step's, before its forward pass) so
        that they compute while the model runs."""
        if self.grammar is not None:
            self.grammar.prefetch([s.matcher for s in seqs if s.matcher is not None])

    def _apply_grammars(self, logits: np.ndarray, seqs: list[Sequence],
                        errors: dict[int, Exception]) -> np.ndarray:
        """Mask each constrained row to the tokens its grammar allows next (one batched call)."""
        rows = [i for i, s in enumerate(seqs) if s.matcher is not None and i not in errors]
        if not rows:
            return logits
        started = time.perf_counter()
        self.grammar.settle()                # a prefetch still computing holds the matchers
        for i in list(rows):
            if seqs[i].matcher.is_error():
                errors[i] = ValueError(f"the structured output grammar failed: {seqs[i].matcher.get_error()}")
                rows.remove(i)
        if not rows:
            return logits
        logits = self.grammar.masked(logits, rows, [seqs[i].matcher for i in rows])
        self.grammar.mask_time_s += time.perf_counter() - started
        self.grammar.masked_rows += len(rows)
        return logits

    def _penalize_row(self, logits: np.ndarray, i: int, seq: Sequence, penalize, mask_stops: bool) -> None:
        p = seq.params
        if penalize:
            ids, counts = np.unique(np.asarray(seq.output_token_ids), return_counts=True)
            logits[i, ids] -= p.frequency_penalty * counts + p.presence_penalty
        if mask_stops:
            stop_ids = list(p.stop_token_ids) + ([] if p.ignore_eos else list(self.eos_token_ids))
            if stop_ids:
                logits[i, stop_ids] = -np.inf

    @staticmethod
    def _shape_row(logits: np.ndarray, i: int, seq: Sequence) -> None:
        """vLLM's repetition penalty (over prompt and output: a positive logit divided by it, a
        negative one multiplied), logit_bias, allowed_token_ids, then bad_words: a word's last
        token is masked when the output so far ends with the tokens before it."""
        p = seq.params
        row = logits[i]
        if p.repetition_penalty != 1.0:
            seen = np.unique(np.asarray(seq.all_token_ids))
            vals = row[seen]
            row[seen] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if p.logit_bias:
            ids = np.fromiter(p.logit_bias.keys(), dtype=np.int64, count=len(p.logit_bias))
            row[ids] += np.fromiter(p.logit_bias.values(), dtype=row.dtype, count=len(p.logit_bias))
        if p.allowed_token_ids is not None:
            keep = np.full(row.shape[0], -np.inf, dtype=row.dtype)
            allowed = np.asarray(p.allowed_token_ids, dtype=np.int64)
            keep[allowed] = row[allowed]
            row[:] = keep
        out = seq.output_token_ids
        for word in p.bad_words_token_ids:
            prefix = word[:-1]
            if not prefix or (len(out) >= len(prefix) and out[len(out) - len(prefix):] == prefix):
                row[word[-1]] = -np.inf

    def _sample_row(self, row: np.ndarray, seq: Sequence) -> int:
        p = seq.params
        row = row.astype(np.float64) / p.temperature
        if p.min_p > 0.0:
            probs = np.exp(row - row.max())
            row = np.where(probs >= p.min_p * probs.max(), row, -np.inf)
        candidates = np.arange(row.shape[0])
        if 0 < p.top_k < row.shape[0]:
            candidates = np.argpartition(-row, p.top_k - 1)[:p.top_k]
            row = row[candidates]
        probs = np.exp(row - row.max())
        probs /= probs.sum()
        if not np.isfinite(probs).all():
            raise ValueError("this request's next-token distribution is not finite (NaN or inf logits)")
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cumulative = np.cumsum(probs[order])
            keep = order[: int(np.searchsorted(cumulative, p.top_p) + 1)]
            candidates, probs = candidates[keep], probs[keep] / probs[keep].sum()
        return int(candidates[seq.rng.choice(len(probs), p=probs)])

    @staticmethod
    def prompt_logprobs(rows: np.ndarray, tokens: list[int], num_top: int) -> list[TokenLogprob]:
        """rows: [len(tokens), vocab], the logits that predicted each token → each token's
        logprob, rank and top alternatives (the model's raw distribution)."""
        out = []
        for row, token in zip(rows, tokens):
            lp = Sampler._logprobs(row, int(token), num_top)
            lp.rank = 1 + int((log_softmax(row.astype(np.float64)) > lp.logprob).sum())
            out.append(lp)
        return out

    @staticmethod
    def _logprobs(raw_row: np.ndarray, token: int, num_top: int) -> TokenLogprob:
        lp = log_softmax(raw_row.astype(np.float64))
        top: list[tuple[int, float]] = []
        if num_top:
            idx = np.argpartition(-lp, num_top - 1)[:num_top]
            idx = idx[np.argsort(-lp[idx], kind="stable")]
            top = [(int(t), float(lp[t])) for t in idx]
        return TokenLogprob(token_id=token, logprob=float(lp[token]), top=top)
