"""The offline API, shaped like vLLM's:

    from mindmotor import LLM, SamplingParams
    llm = LLM()                                   # the bundled demo model on an emulated 910B3
    outs = llm.generate(["def fibonacci(n):"], SamplingParams(max_tokens=32, temperature=0))
    print(outs[0].outputs[0].text)

Each prompt's result is a `RequestOutput` of vLLM's shape: `prompt`, `prompt_token_ids`,
`outputs` (one `CompletionOutput`: `index`, `text`, `token_ids`, `finish_reason`, `stop_reason`,
`logprobs`), `finished`, `num_cached_tokens`, `prompt_logprobs`. The first output's fields are
also on the `RequestOutput` itself (`outs[0].text`, `outs[0].token_ids`), as this API had them
before. `logprobs` are this engine's `TokenLogprob`s, not vLLM's dicts of `Logprob`."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Sequence as Seq

from tqdm import tqdm

from mindmotor.vocabulary import FinishReason

from .config import EngineConfig
from .llm_engine import LLMEngine
from .sampler import TokenLogprob
from mindmotor.rules.sampling_params import SamplingParams


@dataclass
class CompletionOutput:
    """One generated sequence (vLLM's `CompletionOutput`)."""
    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """One prompt's result (vLLM's `RequestOutput`)."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=lambda: [CompletionOutput()])
    finished: bool = False
    num_cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprob] | None = None   # per prompt token after the first

    # the first output's fields, where this API had them before vLLM's shape
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> FinishReason | None:
        return self.outputs[0].finish_reason

    @property
    def stop_reason(self) -> int | str | None:
        return self.outputs[0].stop_reason

    @property
    def logprobs(self) -> list[TokenLogprob]:
        return self.outputs[0].logprobs


GenerationOutput = RequestOutput      # the former name


class LLM:
    def __init__(self, model: str | None = None, device: str = "910B3", emulate: str | None = None,
                 **engine_options):
        self.engine = LLMEngine(EngineConfig(model=model, device=device, emulate=emulate, **engine_options))
        self._ids = itertools.count()

    def add_lora(self, name: str, path: str) -> None:
        """Serve the PEFT adapter directory `path` as `name` (needs enable_lora=True)."""
        self.engine.add_lora(name, path)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: str | Seq[int] | Seq[str | Seq[int]],
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = False, lora: str | None | Seq[str | None] = None) -> list[RequestOutput]:
        """`lora`: the adapter (added with `add_lora`) for every prompt, or one per prompt (None:
        the base model)."""
        prompts = _as_prompt_list(prompts)
        loras = list(lora) if isinstance(lora, (list, tuple)) else [lora] * len(prompts)
        if len(loras) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(loras)} adapters")
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(sampling_params)} sampling params")
        results: dict[str, RequestOutput] = {}
        for prompt, params, adapter in zip(prompts, sampling_params, loras):
            rid = f"offline-{next(self._ids)}"
            seq = self.engine.add_request(rid, prompt, params, lora=adapter)
            results[rid] = RequestOutput(request_id=rid, prompt=prompt if isinstance(prompt, str) else None,
                                         prompt_token_ids=list(seq.prompt_token_ids))
        bar = tqdm(total=len(prompts), desc="generate", disable=not use_tqdm)
        while self.engine.has_unfinished_requests():
            if not self.engine.has_runnable_requests() and (
                    self.engine.next_kv_ready_at() is not None
                    or self.engine.scheduler.batch_wait_until(self.engine.clock()) is not None):
                time.sleep(self.engine.idle_wait_s(0.05))    # host-tier loads in flight, or a fuller batch
            for out in self.engine.step():
                r = results[out.request_id]
                o = r.outputs[0]
                o.token_ids.extend(out.new_token_ids)
                o.text += out.new_text
                o.logprobs.extend(out.new_logprobs)
                if out.prompt_logprobs is not None:
                    r.prompt_logprobs = out.prompt_logprobs
                if out.finished:
                    o.finish_reason, o.stop_reason = out.finish_reason, out.stop_reason
                    r.finished, r.num_cached_tokens = True, out.num_cached_tokens
                    bar.update(1)
        bar.close()
        return list(results.values())


def _as_prompt_list(prompts) -> list[str | list[int]]:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(p, int) for p in prompts):
        return [prompts]
    return [p if isinstance(p, str) else list(p) for p in prompts]
