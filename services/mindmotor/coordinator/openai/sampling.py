"""`SamplingOptions`: the sampling part of an OpenAI request, checked with the engine's own rules
before any worker sees it, and turned into the worker's `SamplingParams` — the same for every
attempt: a worker that resumes a request counts its limits over the whole output."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mindmotor.rules.request_rules import InvalidRequest, check_logit_bias
from mindmotor.rules.sampling_params import SamplingParams
from mindmotor.protocol import worker_pb2 as pb
from mindmotor.rules.constraint import Constraint

from mindmotor.coordinator.http.errors import BadRequest
from mindmotor.coordinator.openai.structured import constraint_from_request


@dataclass(frozen=True)
class SamplingOptions:
    max_tokens: int | None = 16          # None: up to the model's context
    temperature: float | None = None     # None: the engine's default (1.0)
    top_p: float | None = None
    top_k: int = -1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None          # top alternatives per token; 0: the chosen token only
    include_stop_str_in_output: bool = False
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()       # (token id, bias), frozen
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()
    prompt_logprobs: int | None = None   # per prompt token; 0: the prompt token only
    structured: Constraint | None = None
    skip_special_tokens: bool = True

    def __post_init__(self):
        try:
            SamplingParams(max_tokens=self.max_tokens, top_k=self.top_k, seed=self.seed, stop=list(self.stop),
                           stop_token_ids=list(self.stop_token_ids), ignore_eos=self.ignore_eos,
                           min_tokens=self.min_tokens, presence_penalty=self.presence_penalty,
                           frequency_penalty=self.frequency_penalty, logprobs=self.logprobs,
                           min_p=self.min_p, repetition_penalty=self.repetition_penalty,
                           logit_bias=dict(self.logit_bias),
                           allowed_token_ids=None if self.allowed_token_ids is None else list(self.allowed_token_ids),
                           bad_words=list(self.bad_words), prompt_logprobs=self.prompt_logprobs,
                           structured=self.structured, skip_special_tokens=self.skip_special_tokens,
                           **{k: v for k, v in (("temperature", self.temperature), ("top_p", self.top_p))
                              if v is not None})
        except InvalidRequest as exc:
            raise BadRequest(exc.message, param=exc.param, code=exc.code) from None
        except (ValueError, TypeError) as exc:
            raise BadRequest(str(exc), code="invalid_value") from exc

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def for_choice(self, index: int) -> "SamplingOptions":
        """Choice `index` of n: its own seed (seed + index) when a seed is given."""
        if self.seed is None or index == 0:
            return self
        return dataclasses.replace(self, seed=(self.seed + index) % (2**63))

    def to_proto(self) -> pb.SamplingParams:
        p = pb.SamplingParams(top_k=self.top_k, stop=list(self.stop), stop_token_ids=list(self.stop_token_ids),
                              ignore_eos=self.ignore_eos, min_tokens=self.min_tokens,
                              presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                              include_stop_str_in_output=self.include_stop_str_in_output, min_p=self.min_p,
                              logit_bias=dict(self.logit_bias), allowed_token_ids=list(self.allowed_token_ids or ()),
                              bad_words=list(self.bad_words))
        if self.repetition_penalty != 1.0:
            p.repetition_penalty = self.repetition_penalty
        if self.max_tokens is not None:
            p.max_tokens = self.max_tokens
        if self.temperature is not None:
            p.temperature = self.temperature
        if self.top_p is not None:
            p.top_p = self.top_p
        if self.seed is not None:
            p.seed = self.seed
        if self.logprobs is not None:
            p.logprobs = self.logprobs
        if self.prompt_logprobs is not None:
            p.prompt_logprobs = self.prompt_logprobs
        if not self.skip_special_tokens:
            p.skip_special_tokens = False
        if self.structured is not None:
            p.structured.CopyFrom(pb.StructuredOutput(kind=self.structured.kind, spec=self.structured.spec))
        return p



def sampling_from_request(body, max_tokens: int | None, logprobs: int | None,
                          prompt_logprobs: int | None = None) -> SamplingOptions:
    structured = constraint_from_request(body)
    """The SamplingOptions of a completions or chat request body (`schemas._Sampling`)."""
    return SamplingOptions(
        max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
        top_k=body.top_k if body.top_k is not None else -1, seed=body.seed, stop=tuple(body.stop or ()),
        stop_token_ids=tuple(body.stop_token_ids or ()), ignore_eos=body.ignore_eos, min_tokens=body.min_tokens,
        presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty, logprobs=logprobs,
        include_stop_str_in_output=body.include_stop_str_in_output,
        min_p=body.min_p if body.min_p is not None else 0.0,
        repetition_penalty=body.repetition_penalty if body.repetition_penalty is not None else 1.0,
        logit_bias=_logit_bias(body.logit_bias),
        allowed_token_ids=None if body.allowed_token_ids is None else tuple(body.allowed_token_ids),
        bad_words=tuple(body.bad_words or ()), prompt_logprobs=prompt_logprobs, structured=structured,
        skip_special_tokens=body.skip_special_tokens)


def _logit_bias(bias) -> tuple[tuple[int, float], ...]:
    try:
        return tuple(sorted(check_logit_bias(bias).items()))
    except InvalidRequest as exc:
        raise BadRequest(exc.message, param=exc.param, code=exc.code) from None
