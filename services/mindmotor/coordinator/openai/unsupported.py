"""The request fields OpenAI or vLLM accept that change the output and that this server does not
implement (yet): a request that sets one to anything but its neutral value is refused with a 400
naming it, never served as if the field were absent. Fields this server does not know are ignored
and named (`ignored.py`), as vLLM does.

Each entry: field -> (is the value neutral?, why it is refused)."""

from __future__ import annotations

from typing import Any, Callable

from mindmotor.coordinator.http.errors import BadRequest


def _none_or_empty(v: Any) -> bool:
    return v is None or v == [] or v == {} or v == ""


def _is(value) -> Callable[[Any], bool]:
    return lambda v: v is None or v == value


STRUCTURED = "only the default whitespace and no structural tags are implemented for structured outputs"
_COMMON: dict[str, tuple[Callable[[Any], bool], str]] = {
    "guided_whitespace_pattern": (_none_or_empty, STRUCTURED),
    "structural_tag": (_none_or_empty, STRUCTURED),
    "use_beam_search": (_is(False), "beam search is not implemented"),
    "length_penalty": (_is(1.0), "length_penalty applies to beam search, which is not implemented"),
    "spaces_between_special_tokens": (_is(True), "only spaces_between_special_tokens=true is implemented"),
    "logits_processors": (_none_or_empty, "custom logits processors are not supported"),
    "vllm_xargs": (_none_or_empty, "vllm_xargs is not supported"),
    "allowed_token_ids": (lambda v: v is None or v != [], "allowed_token_ids must not be empty"),
}
_COMPLETION: dict[str, tuple[Callable[[Any], bool], str]] = {
    "prompt_embeds": (_none_or_empty, "prompts as embeddings are not supported; send text or token ids"),
}
_CHAT: dict[str, tuple[Callable[[Any], bool], str]] = {
    "functions": (_none_or_empty, "the legacy function-calling fields are not implemented; use tools"),
    "function_call": (lambda v: v is None or v in ("none", "auto"),
                      "the legacy function-calling fields are not implemented; use tool_choice"),
    "chat_template": (_none_or_empty, "a request's own chat_template is not supported"),
    "modalities": (lambda v: v is None or v == ["text"], "only the text modality is supported"),
    "audio": (_is(None), "audio output is not supported"),
}


def refuse_unsupported(data: Any, chat: bool) -> None:
    """BadRequest naming the first field of `data` (the raw JSON body) that asks for something
    not implemented; a message's legacy `function_call` too."""
    if not isinstance(data, dict):
        return
    table = {**_COMMON, **(_CHAT if chat else _COMPLETION)}
    for name, (neutral, why) in table.items():
        if name in data and not neutral(data[name]):
            raise BadRequest(f"{name} is not supported: {why}", param=name, code="unsupported_parameter")
    if chat and isinstance(data.get("messages"), list):
        for i, message in enumerate(data["messages"]):
            if isinstance(message, dict):
                for key in ("function_call",):
                    if not _none_or_empty(message.get(key)):
                        raise BadRequest(f"messages.{i}.{key} is not supported: use tool_calls",
                                         param=f"messages.{i}.{key}", code="unsupported_parameter")
        check_tool_messages(data)


def check_tool_messages(data: Any) -> None:
    """A tool message must name the call it answers (`tool_call_id`), as OpenAI and vLLM require."""
    messages = data.get("messages") if isinstance(data, dict) else None
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        if isinstance(message, dict) and message.get("role") == "tool" and not message.get("tool_call_id"):
            raise BadRequest(f"messages.{i}: a tool message needs tool_call_id, the id of the call it answers",
                             param=f"messages.{i}.tool_call_id", code="missing_required_parameter")
