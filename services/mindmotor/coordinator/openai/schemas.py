"""The request bodies of the HTTP API (OpenAI's, plus vLLM-style tokenize/detokenize), as pydantic
models: types and ranges are checked here, so a bad field is a 400 naming it. Responses are built
as plain dicts (formats in `completion_format` and `chat_format`).

Unknown fields are ignored, as vLLM does, but not silently: every body keeps them (`extra="allow"`)
so that `ignored.py` can name them — in a warning log line with the request id and in the
`X-MindMotor-Ignored-Fields` response header.

Extensions to OpenAI's fields (vLLM's names): `top_k`, `ignore_eos`, `min_tokens`, `priority`
(lower runs first), `stop_token_ids`, `include_stop_str_in_output`, `min_p`, `repetition_penalty`,
`allowed_token_ids`, `bad_words`, `truncate_prompt_tokens`, `skip_special_tokens`, `return_token_ids`,
`add_special_tokens`; on chat `chat_template_kwargs`, `continue_final_message`, `documents`, `echo`.
Fields that would change the output but are not implemented
are refused by name (`unsupported`). Booleans and numbers are coerced as vLLM's (pydantic's lax
mode) do: `"true"`, `1`, `"yes"` are true, `"0.5"` is 0.5; anything else is a 400 naming the field.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mindmotor.rules.request_rules import INT32_MAX, INT64_MAX

from mindmotor.coordinator.openai.unsupported import check_tool_messages, refuse_unsupported

MAX_STOP = 16
MAX_LOGPROBS = 20


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")      # kept to be named as ignored (ignored.py), never used


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False     # vLLM: usage (so far) on every chunk


class _Sampling(_Body):
    """Fields common to both generation endpoints."""
    model: str = ""
    n: int = Field(1, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX)
    seed: int | None = Field(None, ge=0, le=INT64_MAX)      # an int64 on the wire, numpy's seed: >= 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    priority: int = Field(0, ge=-(2**31), le=INT32_MAX)
    include_stop_str_in_output: bool = False
    logit_bias: dict[str, float] | None = None
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    # structured outputs (see `structured`): OpenAI's and vLLM's fields
    response_format: dict | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict | None = None
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False          # vLLM: prompt_token_ids and each choice's token_ids
    skip_special_tokens: bool = True        # false: special tokens stay in the output text
    truncate_prompt_tokens: int | None = Field(None, ge=-1, le=INT64_MAX)   # the last N; -1: the context

    @field_validator("stop")
    @classmethod
    def _stop(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences are allowed")
        if any(not s for s in stops):
            raise ValueError("stop sequences must not be empty")
        return stops

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data):
        refuse_unsupported(data, chat=cls.__name__.startswith("Chat"))
        return data

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.continuous_usage_stats)


PromptType = Union[str, list[str], list[int], list[list[int]]]


class CompletionRequest(_Sampling):
    prompt: PromptType
    max_tokens: int | None = Field(16, ge=0)    # 0: with echo, score the prompt only
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    add_special_tokens: bool = True         # vLLM's default for completions: the tokenizer's BOS, if any

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, value):
        if value:
            raise ValueError("suffix is not supported")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, value):
        if value not in (None, 1):
            raise ValueError("best_of is not supported (use n)")
        return value


class TextPart(_Body):
    type: Literal["text"]
    text: str


class FunctionCall(_Body):
    name: str
    arguments: str


class ToolCallIn(_Body):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall

    @field_validator("function")
    @classmethod
    def _arguments_are_json(cls, value):
        try:
            json.loads(value.arguments)
        except ValueError:
            raise ValueError("function.arguments must be JSON text") from None
        return value


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None       # an assistant's calls, in the history
    tool_call_id: str | None = None                  # a tool message: the call it answers (required)

    def template_dict(self) -> dict:
        """The message as the chat template takes it."""
        out = {"role": self.role, "content": self.text(), "tool_calls": None}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": c.type, "function": {"name": c.function.name,
                                                                           "arguments": c.function.arguments}}
                                 for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    echo: bool = False                      # vLLM: the last message's content first, when its role is the reply's
    continue_final_message: bool = False    # the last message left open and continued (no generation prompt)
    add_special_tokens: bool = False        # vLLM's default for chat: the template writes them
    documents: list[dict[str, str]] | None = None        # to the chat template (RAG templates read them)
    chat_template_kwargs: dict[str, Any] | None = None   # more chat template variables (enable_thinking)

    @property
    def reply_role(self) -> str:
        """The role of the message generated: the assistant's, or — without a generation prompt —
        the last message's, which is continued (vLLM's rule)."""
        return "assistant" if self.add_generation_prompt else self.messages[-1].role

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(_Body):
    """Either `prompt` (text) or `messages` (through the chat template)."""
    model: str = ""
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool | None = None   # None: vLLM's default — true for a prompt, false for messages
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False

    @model_validator(mode="before")
    @classmethod
    def _tool_messages(cls, data):
        check_tool_messages(data)
        return data


class DetokenizeRequest(_Body):
    model: str = ""
    tokens: list[int]
