from __future__ import annotations

from fastapi import APIRouter, Request

from mindmotor.coordinator.http.errors import BadRequest
from mindmotor.coordinator.openai.prompts import chat_text, encode_text
from mindmotor.coordinator.openai.schemas import DetokenizeRequest, TokenizeRequest
from mindmotor.coordinator.state import CoordinatorDep

router = APIRouter()


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request, c: CoordinatorDep):
    model = c.catalog.resolve(body.model)
    request.state.model = model.name
    if (body.prompt is None) == (body.messages is None):
        raise BadRequest("give exactly one of 'prompt' and 'messages'", param="prompt")
    text = body.prompt if body.prompt is not None else await chat_text(
        body.messages, model.tokenizer, body.add_generation_prompt, max_chars=c.settings.max_prompt_chars)
    tokens = await encode_text(model.tokenizer, text, "prompt" if body.prompt is not None else "messages")
    out = {"count": len(tokens), "max_model_len": model.max_model_len or None, "tokens": tokens}
    if body.return_token_strs:
        out["token_strs"] = [model.tokenizer.id_to_token(t) for t in tokens]
    return out


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request, c: CoordinatorDep):
    model = c.catalog.resolve(body.model)
    request.state.model = model.name
    vocab = model.tokenizer.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise BadRequest(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})", param="tokens")
    return {"prompt": model.tokenizer.decode(body.tokens)}
