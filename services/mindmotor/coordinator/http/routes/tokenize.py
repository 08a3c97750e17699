from __future__ import annotations

from fastapi import APIRouter, Request

from mindmotor.coordinator.http.errors import BadRequest
from mindmotor.coordinator.http.ignored import note_ignored, unknown_fields
from mindmotor.coordinator.http.openapi import DetokenizeResponse, TokenizeResponse, api_errors
from mindmotor.coordinator.openai.prompts import TemplateOptions, chat_text, encode_text
from mindmotor.coordinator.openai.schemas import DetokenizeRequest, TokenizeRequest
from mindmotor.coordinator.state import CoordinatorDep

router = APIRouter()


@router.post("/tokenize", responses={200: {"model": TokenizeResponse}, **api_errors()})
async def tokenize(body: TokenizeRequest, request: Request, c: CoordinatorDep):
    note_ignored(request, unknown_fields(body))
    model = c.catalog.resolve(body.model)
    request.state.model = model.name
    if (body.prompt is None) == (body.messages is None):
        raise BadRequest("give exactly one of 'prompt' and 'messages'", param="prompt")
    if body.prompt is not None:
        text, special = body.prompt, body.add_special_tokens is not False
    else:
        options = TemplateOptions.of(body)
        note_ignored(request, options.unused(model.tokenizer))
        text = await chat_text(body.messages, model.tokenizer, options, max_chars=c.settings.max_prompt_chars)
        special = bool(body.add_special_tokens)
    tokens = await encode_text(model.tokenizer, text, "prompt" if body.prompt is not None else "messages",
                               add_special_tokens=special)
    out = {"count": len(tokens), "max_model_len": model.max_model_len or None, "tokens": tokens}
    if body.return_token_strs:
        out["token_strs"] = [model.tokenizer.id_to_token(t) for t in tokens]
    return out


@router.post("/detokenize", responses={200: {"model": DetokenizeResponse}, **api_errors()})
async def detokenize(body: DetokenizeRequest, request: Request, c: CoordinatorDep):
    note_ignored(request, unknown_fields(body))
    model = c.catalog.resolve(body.model)
    request.state.model = model.name
    vocab = model.tokenizer.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise BadRequest(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})", param="tokens")
    return {"prompt": model.tokenizer.decode(body.tokens)}
