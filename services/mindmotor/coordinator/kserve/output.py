"""The outputs of a `GenerateCall` in the shapes Triton's clients read: `output_tensors` for
`infer` (text_output and the extra outputs asked for, shaped like text_input), a flat object for
`/generate` (`{"model_name", "model_version", "text_output", ...}`), one such object per SSE event
for `/generate_stream` (the text each piece adds), and `{"error": message}` for an error after the
stream began, which ends without OpenAI's `[DONE]`."""

from __future__ import annotations

from mindmotor.coordinator.dispatch.generation import Piece, Usage
from mindmotor.coordinator.http.errors import APIError
from mindmotor.coordinator.kserve.llm_model import VERSION, GenerateCall
from mindmotor.coordinator.kserve.tensors import Tensor
from mindmotor.coordinator.openai.results import ChoiceResult


class KServeFormat:
    stream_end = None

    def __init__(self, model: str, call: GenerateCall, prompt_lengths: list[int]):
        self.model = model
        self.call = call
        self.prompt_lengths = prompt_lengths

    def _head(self) -> dict:
        return {"model_name": self.model, "model_version": VERSION}

    # ---- a stream (one prompt; the prompt is never prepended) ----------------------------------
    def stream_start(self, index: int) -> list[dict]:
        return []

    def stream_piece(self, index: int, piece: Piece) -> list[dict]:
        out = {**self._head(), "text_output": piece.text}
        returns = self.call.returns
        if "finish_reason" in returns:
            out["finish_reason"] = piece.finish_reason or ""
        if "num_input_tokens" in returns:
            out["num_input_tokens"] = self.prompt_lengths[index]
        if "num_output_tokens" in returns:
            out["num_output_tokens"] = len(piece.token_ids)
        return [out]

    def stream_error(self, exc: APIError) -> dict:
        return {"error": exc.message}

    def usage_chunk(self, usage: Usage) -> dict:       # never asked for (include_usage is off)
        return {}

    # ---- all at once ---------------------------------------------------------------------------
    def response(self, results: list[ChoiceResult], usage: Usage) -> dict:
        """Per output name, its values in text_input's order (`tensors` and `generate_body` shape them)."""
        prompts = self.call.prompts
        out: dict[str, list] = {"text_output": [(prompts[i] if self.call.prepend else "") + r.text
                                                for i, r in enumerate(results)]}
        if "finish_reason" in self.call.returns:
            out["finish_reason"] = [r.finish_reason or "" for r in results]
        if "num_input_tokens" in self.call.returns:
            out["num_input_tokens"] = list(self.prompt_lengths)
        if "num_output_tokens" in self.call.returns:
            out["num_output_tokens"] = [len(r.token_ids) for r in results]
        return out

    def tensors(self, values: dict[str, list]) -> list[Tensor]:
        types = {"num_input_tokens": "UINT32", "num_output_tokens": "UINT32"}
        return [Tensor(name, types.get(name, "BYTES"), list(self.call.shape), column)
                for name, column in values.items()]

    def generate_body(self, values: dict[str, list]) -> dict:
        single = len(self.call.prompts) == 1
        return {**self._head(), **{name: column[0] if single else column for name, column in values.items()}}
