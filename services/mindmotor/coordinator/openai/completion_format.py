"""The completions API's response and stream chunks (`object: "text_completion"`).

Echo with logprobs (prompt scoring, as lm-evaluation-harness does it) puts the prompt's tokens
first in `logprobs` — the first with a null logprob, the others with theirs from the prefill —
and, in a stream, sends the echoed prompt with the first piece (when its logprobs are known).
`max_tokens: 0` with echo scores the prompt only: the engine samples one token (it cannot
prefill without), which is neither shown nor counted, as in vLLM.

`return_token_ids` (vLLM's): each choice has `prompt_token_ids` (in a stream: on the choice's
first chunk) and `token_ids`, the tokens it generated (in a stream: each chunk's new ones)."""

from __future__ import annotations

from dataclasses import dataclass

from mindmotor.coordinator.dispatch.respond import OpenAIFraming
from mindmotor.coordinator.dispatch.generation import Piece, Usage
from mindmotor.coordinator.openai.logprobs import CompletionLogprobs, TokenText, vllm_prompt_logprobs
from mindmotor.coordinator.openai.results import ChoiceResult, usage_body
from mindmotor.coordinator.openai.running_usage import RunningUsage

OBJECT = "text_completion"


@dataclass(frozen=True)
class EchoOptions:
    texts: list[str]                  # per choice: the prompt's text
    token_ids: list[list[int]]        # per choice: the prompt's tokens
    score_only: bool = False          # max_tokens 0: the prompt alone, no generated token


class CompletionFormat(OpenAIFraming):
    def __init__(self, response_id: str, created: int, model: str, tokens: TokenText, logprobs: int | None,
                 echo: EchoOptions | None, include_usage: bool, prompt_logprobs: int | None = None,
                 as_ids: bool = False, prompt_ids: list[list[int]] | None = None,
                 running: RunningUsage | None = None, return_token_ids: bool = False):
        self.response_id = response_id
        self.return_token_ids = return_token_ids
        self._ids_sent: set[int] = set()        # choices whose prompt_token_ids were streamed
        self.created = created
        self.model = model
        self.tokens = tokens
        self.logprobs = logprobs
        self.echo = echo
        self.include_usage = include_usage
        self.prompt_logprobs = prompt_logprobs      # vLLM's field, when asked
        self.prompt_ids = prompt_ids                # per choice (for prompt_logprobs)
        self.as_ids = as_ids
        self._lp: dict[int, CompletionLogprobs] = {}
        self._echo_pending: set[int] = set()
        self.running = running                      # continuous_usage_stats

    @property
    def resumable(self) -> bool:
        """Whether a cut stream can be resumed (resume.py): not with logprobs (their text offsets
        run over the whole output)."""
        return self.logprobs is None

    @property
    def _echo_logprobs(self) -> bool:
        return self.echo is not None and self.logprobs is not None

    @property
    def _score_only(self) -> bool:
        return self.echo is not None and self.echo.score_only

    def _chunk(self, choices: list[dict]) -> dict:
        chunk = {"id": self.response_id, "object": OBJECT, "created": self.created, "model": self.model,
                 "choices": choices}
        if self.include_usage:
            chunk["usage"] = None
        if self.running is not None:
            chunk["usage"] = self.running.body(choices[0]["index"])
        return chunk

    def _logprobs(self, index: int) -> CompletionLogprobs:
        lp = self._lp.get(index)
        if lp is None:
            offset = len(self.echo.texts[index]) if self.echo else 0
            lp = self._lp[index] = CompletionLogprobs(self.tokens, self.logprobs or 0, offset, self.as_ids)
        return lp

    def _prompt_part(self, index: int, entries) -> dict:
        return CompletionLogprobs(self.tokens, self.logprobs or 0, 0, self.as_ids).prompt(
            self.echo.token_ids[index], entries)

    def _choice(self, index: int, text: str, generated, prompt_entries, with_echo: bool,
                generated_ids: list[int] = ()) -> dict:
        """One choice's text and logprobs: the echoed prompt first when `with_echo`, then what was
        generated (nothing when scoring only)."""
        generated_text, generated_lp = ("", []) if self._score_only else (text, generated)
        parts = []
        if with_echo and self._echo_logprobs:
            parts.append(self._prompt_part(index, prompt_entries))
        if self.logprobs is not None and generated_lp:
            parts.append(self._logprobs(index).piece(generated_lp))
        logprobs = CompletionLogprobs.merge(parts) if self.logprobs is not None else None
        echo = self.echo.texts[index] if with_echo and self.echo else ""
        choice = {"index": index, "text": echo + generated_text, "logprobs": logprobs}
        if self.return_token_ids:
            if index not in self._ids_sent:
                choice["prompt_token_ids"] = list(self.prompt_ids[index])
            choice["token_ids"] = [] if self._score_only else list(generated_ids)
        if self.prompt_logprobs is not None and prompt_entries is not None:
            choice["prompt_logprobs"] = vllm_prompt_logprobs(
                self.prompt_ids[index][0], prompt_entries, self.tokens, self.prompt_logprobs, self.as_ids)
        return choice

    def stream_start(self, index: int) -> list[dict]:
        if not self.echo:
            return []
        if self._echo_logprobs or self.prompt_logprobs is not None:
            self._echo_pending.add(index)       # sent with the first piece, which has the prompt's logprobs
            return []
        if self.echo.texts[index]:
            return [self._chunk([{"index": index, "text": self.echo.texts[index], "logprobs": None,
                                  "finish_reason": None}])]
        return []

    def stream_piece(self, index: int, piece: Piece) -> list[dict]:
        if self.running is not None and not self._score_only:
            self.running.add(index, len(piece.token_ids))
        with_echo = index in self._echo_pending
        self._echo_pending.discard(index)
        shows = (piece.text or (self.logprobs is not None and piece.logprobs)
                 or (self.return_token_ids and piece.token_ids)) and not self._score_only
        if not (shows or with_echo or piece.finish_reason or piece.prompt_logprobs):
            return []
        prompt_entries = piece.prompt_logprobs if (with_echo or piece.prompt_logprobs) else None
        choice = self._choice(index, piece.text, piece.logprobs, prompt_entries, with_echo, piece.token_ids)
        if self.return_token_ids:
            self._ids_sent.add(index)
        choice["finish_reason"] = piece.finish_reason
        if piece.finish_reason is not None:
            choice["stop_reason"] = piece.stop_reason
        return [self._chunk([choice])]

    def _usage(self, usage: Usage) -> Usage:
        if self._score_only:                    # the token sampled to finish the prefill is not output
            return Usage(prompt_tokens=usage.prompt_tokens, completion_tokens=0, cached_tokens=usage.cached_tokens)
        return usage

    def usage_chunk(self, usage: Usage) -> dict:
        return {"id": self.response_id, "object": OBJECT, "created": self.created, "model": self.model,
                "choices": [], "usage": usage_body(self._usage(usage))}

    def response(self, results: list[ChoiceResult], usage: Usage) -> dict:
        choices = []
        for index, result in enumerate(results):
            choice = self._choice(index, result.text, result.logprobs, result.prompt_logprobs, True, result.token_ids)
            choice.update(finish_reason=result.finish_reason, stop_reason=result.stop_reason)
            choices.append(choice)
        return {"id": self.response_id, "object": OBJECT, "created": self.created, "model": self.model,
                "choices": choices, "usage": usage_body(self._usage(usage)), "system_fingerprint": None}
