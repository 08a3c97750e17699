"""vLLM's `stream_options.continuous_usage_stats`: every stream chunk of a choice carries the usage
so far — the prompt's tokens and the tokens the choice has produced up to that chunk."""

from __future__ import annotations


class RunningUsage:
    def __init__(self, prompt_tokens: list[int]):
        self.prompt_tokens = prompt_tokens          # per choice
        self.completion: dict[int, int] = {}

    def add(self, index: int, num_tokens: int) -> None:
        self.completion[index] = self.completion.get(index, 0) + num_tokens

    def body(self, index: int) -> dict:
        prompt, done = self.prompt_tokens[index], self.completion.get(index, 0)
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}
