"""What the engine reports per request per step, and the stop rules applied to each new token."""

from __future__ import annotations

from dataclasses import dataclass, field

from mindmotor.common.tokenizer import IncrementalDetokenizer, Tokenizer
from mindmotor.vocabulary import FinishReason

from .sampler import TokenLogprob
from .sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class RequestOutput:
    """One step's news for one request: the tokens and text added since the last output."""
    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: FinishReason | None = None   # STOP | LENGTH | ABORT | ERROR | PREFILLED
    stop_reason: int | str | None = None      # the stop token id or stop string that matched
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    error: str | None = None                  # finish_reason ERROR: what the engine raised for it
    prompt_logprobs: list[TokenLogprob] | None = None   # on the first output, when prompt_logprobs was asked
    # on the last output: the engine-clock times of its phases (vLLM's queued/prefill/decode)
    arrival_time: float | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    num_preemptions: int = 0
    kv_tier_load: tuple[float, float, int] | None = None   # its last KV host-tier load: start, end, blocks


class OutputProcessor:
    """Detokenizes each sequence incrementally and decides when it stops (without a tokenizer —
    the cost-only runner — there is no text: token ids and the length rules only).

    With stop strings, the last `max(len(stop)) - 1` characters are held back until it is certain
    they do not begin a stop string, so a client never sees part of one.
    """

    def __init__(self, tokenizer: Tokenizer | None, eos_token_ids: tuple[int, ...], max_model_len: int):
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.max_model_len = max_model_len
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._emitted: dict[str, int] = {}  # characters of output_text already sent

    def add(self, seq: Sequence) -> None:
        if self.tokenizer is not None:
            self._detok[seq.request_id] = IncrementalDetokenizer(
                self.tokenizer, seq.prompt_token_ids, skip_special_tokens=seq.params.skip_special_tokens)
        self._emitted[seq.request_id] = 0

    def forget(self, request_id: str) -> None:
        """Drop a request's state (it failed)."""
        self._detok.pop(request_id, None)
        self._emitted.pop(request_id, None)

    def resume(self, seq: Sequence, token_ids: list[int], sent_chars: int) -> None:
        """`seq` produced `token_ids` on another worker (a continuation), which sent the first
        `sent_chars` characters of their text: take them as output (no stop rules: they did not
        stop it there) and continue the stream after those characters, so text the other worker
        held back or could not finish (part of a character, a possible stop string) follows from
        here."""
        seq.output_token_ids.extend(token_ids)
        if self.tokenizer is not None:
            seq.output_text = self._detok[seq.request_id].add(token_ids)
        self._emitted[seq.request_id] = sent_chars

    def on_token(self, seq: Sequence, token: int) -> SequenceStatus | None:
        """Append `token` to `seq`; return the finished status if it ends the sequence. (Called
        once per sampled token: the checks read each field once, in the order of the rules.)"""
        out_ids = seq.output_token_ids
        out_ids.append(token)
        p = seq.params
        n_out = len(out_ids)
        past_min = n_out >= p.min_tokens
        if past_min:
            if token in self.eos_token_ids and not p.ignore_eos:
                return SequenceStatus.FINISHED_STOPPED
            if p.stop_token_ids and token in p.stop_token_ids:
                seq.stop_reason = token
                return SequenceStatus.FINISHED_STOPPED
        detok = self._detok.get(seq.request_id)
        if detok is not None:
            delta = detok.add_one(token)
            if delta:
                seq.output_text += delta
                if p.stop and past_min and self._match_stop_string(seq, len(delta)):
                    return SequenceStatus.FINISHED_STOPPED
        if p.max_tokens is not None and n_out >= p.max_tokens:
            return SequenceStatus.FINISHED_LENGTH
        if len(seq.prompt_token_ids) + n_out >= seq.max_total_tokens:
            return SequenceStatus.FINISHED_LENGTH
        return None

    def _match_stop_string(self, seq: Sequence, delta_len: int) -> bool:
        text = seq.output_text
        for stop in seq.params.stop:
            start = max(0, len(text) - delta_len - len(stop) + 1)
            at = text.find(stop, start)
            if at != -1:
                end = at + len(stop) if seq.params.include_stop_str_in_output else at
                seq.output_text = text[:end]
                seq.stop_reason = stop
                return True
        return False

    def make_output(self, seq: Sequence, new_tokens: list[int], new_logprobs: list) -> RequestOutput:
        rid, status = seq.request_id, seq.status
        if status is SequenceStatus.RUNNING:          # the common case, in a step of many
            stop = seq.params.stop
            text = seq.output_text
            visible = len(text) - (max(len(s) for s in stop) - 1 if stop else 0)
            sent = self._emitted.get(rid, 0)
            if visible > sent:
                self._emitted[rid] = visible
                new_text = text[sent:visible]
            else:
                new_text = ""
            return RequestOutput(request_id=rid, new_token_ids=new_tokens, new_text=new_text, finished=False,
                                 stop_reason=seq.stop_reason, num_prompt_tokens=len(seq.prompt_token_ids),
                                 num_output_tokens=len(seq.output_token_ids),
                                 num_cached_tokens=seq.num_cached_tokens, new_logprobs=new_logprobs)
        finished = status.finished
        # a request that continues elsewhere keeps its hold-back (stop strings, partial characters)
        final = finished and not status.continues_elsewhere
        if final and seq.stop_reason is None and rid in self._detok:
            # flush characters held back by the detokenizer (an incomplete UTF-8 sequence)
            seq.output_text += self._detok[rid].flush()
        hold = 0
        if seq.params.stop and not final:
            hold = max(len(s) for s in seq.params.stop) - 1
        sent = self._emitted.get(rid, 0)
        visible = max(sent, len(seq.output_text) - hold)
        text = seq.output_text[sent:visible]
        self._emitted[rid] = visible
        if finished:
            self._detok.pop(rid, None)
            self._emitted.pop(rid, None)
        return RequestOutput(
            request_id=rid, new_token_ids=new_tokens, new_text=text, finished=finished,
            finish_reason=FinishReason(status.value) if finished else None, stop_reason=seq.stop_reason,
            num_prompt_tokens=seq.num_prompt_tokens, num_output_tokens=seq.num_output_tokens,
            num_cached_tokens=seq.num_cached_tokens, new_logprobs=new_logprobs,
            **(dict(arrival_time=seq.arrival_time, first_scheduled_time=seq.first_scheduled_time,
                    first_token_time=seq.first_token_time, num_preemptions=seq.num_preemptions,
                    kv_tier_load=seq.kv_tier_load)
               if finished else {}))
