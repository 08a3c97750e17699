"""`SamplingParams`: how one request's tokens are chosen and when it stops. Validated on creation;
every bad value raises `InvalidRequest` (a `ValueError`) naming the field, with a message a user
can act on. The ranges fit the wire (worker.proto) and numpy: see `request_rules`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .constraint import Constraint, check_limits

from .request_rules import (INT32_MAX, INT64_MAX, UINT32_MAX, InvalidRequest, check_bad_words, check_logit_bias,
                            check_texts, check_token_ids)


@dataclass
class SamplingParams:
    max_tokens: int | None = 16        # None: up to the model's context
    temperature: float = 1.0           # 0 means greedy
    top_p: float = 1.0
    top_k: int = -1                    # -1 (or 0): all tokens
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None        # how many top alternatives per token (0: the chosen one only)
    include_stop_str_in_output: bool = False
    min_p: float = 0.0                 # drop tokens below min_p × the most likely token's probability
    repetition_penalty: float = 1.0    # vLLM's: over prompt and output, > 1 discourages repeats
    logit_bias: dict[int, float] = field(default_factory=dict)   # token id -> added to its logit
    allowed_token_ids: list[int] | None = None                   # only these may be sampled
    bad_words: list[str] = field(default_factory=list)           # never produced (their tokens)
    bad_words_token_ids: list[list[int]] = field(default_factory=list)   # set by the engine
    prompt_logprobs: int | None = None  # per prompt token (after the first): top alternatives; 0: itself only
    structured: Constraint | None = None   # structured output: the grammar every output must follow
    skip_special_tokens: bool = True   # special tokens (<|im_end|>, ...) left out of the output text

    MAX_LOGPROBS = 20
    GREEDY_BELOW = 1e-5                # a smaller temperature samples as greedy (1 / t would overflow)

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = check_token_ids(self.stop_token_ids or [], "stop_token_ids")
        if self.top_k == 0:
            self.top_k = -1
        self.logit_bias = check_logit_bias(self.logit_bias)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = check_token_ids(self.allowed_token_ids, "allowed_token_ids")
            if not self.allowed_token_ids:
                raise InvalidRequest("allowed_token_ids must not be empty", param="allowed_token_ids")
        self.bad_words = check_bad_words(self.bad_words)
        if self.structured is not None:
            check_limits(self.structured)       # cheap; compiling is the helper's and the engine's (grammar.py)
        self._validate()

    @property
    def greedy(self) -> bool:
        return self.temperature < self.GREEDY_BELOW or self.top_k == 1

    def _validate(self) -> None:
        def bad(param: str, message: str):
            raise InvalidRequest(message, param=param)

        for name in ("max_tokens", "top_k", "seed", "min_tokens", "logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                bad(name, f"{name} must be an integer, got {value!r}")
        for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p",
                     "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                bad(name, f"{name} must be a finite number, got {value!r}")
        if self.max_tokens is not None and self.max_tokens < 1:
            bad("max_tokens", f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.max_tokens is not None and self.max_tokens > UINT32_MAX:
            bad("max_tokens", f"max_tokens must be below 2^32, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 2.0:
            bad("temperature", f"temperature must be in [0, 2], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            bad("top_k", f"top_k must be -1 (disable), or at least 1, got {self.top_k}")
        if self.top_k > INT32_MAX:
            bad("top_k", f"top_k must be below 2^31, got {self.top_k}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            bad("presence_penalty", f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            bad("frequency_penalty", f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", f"min_p must be in [0, 1], got {self.min_p}")
        if not 0.0 < self.repetition_penalty <= 2.0:
            bad("repetition_penalty", f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        if self.min_tokens < 0:
            bad("min_tokens", f"min_tokens must be at least 0, got {self.min_tokens}")
        if self.min_tokens > UINT32_MAX:
            bad("min_tokens", f"min_tokens must be below 2^32, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.logprobs is not None and not 0 <= self.logprobs <= self.MAX_LOGPROBS:
            bad("logprobs", f"logprobs must be in [0, {self.MAX_LOGPROBS}], got {self.logprobs}")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= self.MAX_LOGPROBS:
            bad("prompt_logprobs", f"prompt_logprobs must be in [0, {self.MAX_LOGPROBS}], got {self.prompt_logprobs}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad("stop", "stop strings must be non-empty strings")
        if len(self.stop) > 16:
            bad("stop", f"at most 16 stop strings are allowed, got {len(self.stop)}")
        check_texts(self.stop, "stop")
        if self.seed is not None and not 0 <= self.seed <= INT64_MAX:
            bad("seed", f"seed must be in [0, 2^63 - 1], got {self.seed}")
