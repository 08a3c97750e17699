"""What a MindMotor model looks like to a Triton client: the inputs and outputs of Triton's vLLM
backend (`text_input` → `text_output`, `stream`, `sampling_parameters`, `exclude_input_in_output`,
the `return_*` flags), read from an `infer` request's tensors or a `generate` body into one
`GenerateCall`, and turned into the `/v1/completions` request that runs it.

Semantics follow the vLLM backend (triton-inference-server/vllm_backend, `src/utils/request.py`):
the prompt is prepended to `text_output` unless `exclude_input_in_output` is true, and a stream
never prepends it (asking for both is an error); sampling parameters come from the
`sampling_parameters` input (JSON text) or else the request's `parameters`, with vLLM's
`SamplingParams` names. Anything else — an unknown input, an unknown sampling parameter, an output
this model does not have — is refused with a 400 that names it, never ignored."""

from __future__ import annotations

import json
from dataclasses import dataclass

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from mindmotor.coordinator.http.errors import BadRequest, validation_error
from mindmotor.coordinator.kserve.tensors import InferRequest, Tensor
from mindmotor.coordinator.openai.schemas import CompletionRequest

PLATFORM = "mindmotor_llm"
BACKEND = "mindmotor"
VERSION = "1"              # Triton's version policy: each served model has version "1"

FLAGS = ("stream", "exclude_input_in_output", "return_finish_reason", "return_num_input_tokens",
         "return_num_output_tokens")
# (name, datatype, dims) as Triton's vLLM backend declares them; -1: any length
INPUTS = [("text_input", "BYTES", [1]), ("sampling_parameters", "BYTES", [1]),
          *((flag, "BOOL", [1]) for flag in FLAGS)]
OUTPUTS = [("text_output", "BYTES", [-1]), ("finish_reason", "BYTES", [-1]),
           ("num_input_tokens", "UINT32", [-1]), ("num_output_tokens", "UINT32", [-1])]
INPUT_NAMES = frozenset(name for name, _, _ in INPUTS)
OUTPUT_NAMES = frozenset(name for name, _, _ in OUTPUTS)
# vLLM SamplingParams names a request may set, as the completions API takes them
SAMPLING = frozenset({"max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
                      "ignore_eos", "min_tokens", "presence_penalty", "frequency_penalty", "repetition_penalty",
                      "include_stop_str_in_output", "logit_bias", "allowed_token_ids", "bad_words"})
# request parameters that are the protocol's own, not sampling parameters
PROTOCOL_PARAMETERS = frozenset({"binary_data_output", "priority", "timeout", "sequence_id", "sequence_start",
                                 "sequence_end", "headers", "stream", "exclude_input_in_output"})


@dataclass
class GenerateCall:
    prompts: list[str]
    shape: list[int]                 # the text_input's shape (outputs have it too)
    stream: bool = False
    prepend: bool = True             # the prompt before the generated text (not exclude_input_in_output)
    sampling: dict | None = None
    priority: int = 0
    returns: frozenset[str] = frozenset()    # the extra outputs asked for: "finish_reason", ...

    def completion_request(self, model: str) -> CompletionRequest:
        body = {**(self.sampling or {}), "model": model, "prompt": self.prompts, "stream": self.stream,
                "priority": self.priority}
        try:
            return CompletionRequest.model_validate(body)
        except ValidationError as exc:
            raise validation_error(RequestValidationError(exc.errors())) from None


def from_infer(request: InferRequest) -> GenerateCall:
    unknown = sorted(set(request.inputs) - INPUT_NAMES)
    if unknown:
        raise BadRequest(f"unexpected inference input {unknown[0]!r}; this model takes {sorted(INPUT_NAMES)}",
                         param=unknown[0])
    for output in request.outputs or ():
        if output.get("name") not in OUTPUT_NAMES:
            raise BadRequest(f"unexpected inference output {output.get('name')!r}; this model has "
                             f"{sorted(OUTPUT_NAMES)}", param="outputs")
    text = request.inputs.get("text_input")
    if text is None:
        raise BadRequest("the input 'text_input' is required", param="text_input")
    if text.datatype != "BYTES":
        raise BadRequest("the input 'text_input' must be BYTES", param="text_input")
    flags = {}
    for flag in FLAGS:
        tensor = request.inputs.get(flag)
        if tensor is not None:
            flags[flag] = _flag(tensor)
    sampling_text = request.inputs.get("sampling_parameters")
    sampling = _sampling_input(sampling_text) if sampling_text is not None else request.parameters
    return _call(list(text.values), list(text.shape), flags, sampling, request.parameters)


def from_generate(doc) -> GenerateCall:
    """Triton's generate extension: the body's keys are input names, `parameters` the request's."""
    if not isinstance(doc, dict):
        raise BadRequest("the generate request must be a JSON object")
    parameters = doc.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise BadRequest("'parameters' must be an object", param="parameters")
    unknown = sorted(set(doc) - INPUT_NAMES - {"parameters", "id"})
    if unknown:
        raise BadRequest(f"unexpected input {unknown[0]!r}; this model takes {sorted(INPUT_NAMES)}",
                         param=unknown[0])
    text = doc.get("text_input")
    prompts = [text] if isinstance(text, str) else text
    if not (isinstance(prompts, list) and prompts and all(isinstance(p, str) for p in prompts)):
        raise BadRequest("'text_input' must be a string (or a list of strings)", param="text_input")
    flags = {}
    for flag in FLAGS:
        if flag in doc or flag in parameters:
            value = doc.get(flag, parameters.get(flag))
            if not isinstance(value, bool):
                raise BadRequest(f"{flag!r} must be true or false", param=flag)
            flags[flag] = value
    sampling = _sampling_input_text(doc["sampling_parameters"]) if "sampling_parameters" in doc else parameters
    return _call(prompts, [len(prompts)], flags, sampling, parameters)


def _call(prompts: list[str], shape: list[int], flags: dict, sampling: dict, parameters: dict) -> GenerateCall:
    stream = flags.get("stream", False)
    if "exclude_input_in_output" in flags:
        prepend = not flags["exclude_input_in_output"]
    else:
        prepend = not stream
    if prepend and stream:
        raise BadRequest("when streaming, exclude_input_in_output false is not allowed",
                         param="exclude_input_in_output")
    if stream and len(prompts) != 1:
        raise BadRequest("a stream takes exactly one text_input", param="text_input")
    priority = parameters.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise BadRequest("the 'priority' parameter must be an integer", param="priority")
    returns = frozenset(flag.removeprefix("return_") for flag in FLAGS if flag.startswith("return_") and flags.get(flag))
    return GenerateCall(prompts, shape, stream, prepend, _sampling(sampling), priority, returns)


def _flag(tensor: Tensor) -> bool:
    if tensor.datatype != "BOOL" or len(tensor.values) != 1:
        raise BadRequest(f"the input {tensor.name!r} must be one BOOL", param=tensor.name)
    return bool(tensor.values[0])


def _sampling_input(tensor: Tensor) -> dict:
    if tensor.datatype != "BYTES" or len(tensor.values) != 1:
        raise BadRequest("the input 'sampling_parameters' must be one BYTES element (JSON text)",
                         param="sampling_parameters")
    return _sampling_input_text(tensor.values[0])


def _sampling_input_text(text) -> dict:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise BadRequest("'sampling_parameters' must be a JSON object in text", param="sampling_parameters")
    return value


def _sampling(parameters: dict) -> dict:
    """vLLM's sampling parameters; a Triton client may send numbers as strings ('0.5')."""
    out = {}
    for key, value in parameters.items():
        if key in PROTOCOL_PARAMETERS:
            continue
        if key not in SAMPLING:
            raise BadRequest(f"unknown sampling parameter {key!r}; supported: {sorted(SAMPLING)}", param=key)
        if isinstance(value, str) and key not in ("stop", "bad_words"):
            try:
                value = json.loads(value)
            except ValueError:
                raise BadRequest(f"sampling parameter {key!r}: {value!r} is not a value", param=key) from None
        out[key] = value
    return out


def metadata(model: str) -> dict:
    tensors = lambda spec: [{"name": n, "datatype": t, "shape": d} for n, t, d in spec]   # noqa: E731
    return {"name": model, "versions": [VERSION], "platform": PLATFORM,
            "inputs": tensors(INPUTS), "outputs": tensors(OUTPUTS)}


def config(model: str) -> dict:
    """The model's configuration as Triton shows it (`GET /v2/models/{m}/config`): a decoupled model
    (a stream is many responses) that batches inside its engine, like Triton's vLLM backend, so
    Triton-level batching is off (`max_batch_size` 0)."""
    types = {"BYTES": "TYPE_STRING", "BOOL": "TYPE_BOOL", "UINT32": "TYPE_UINT32"}
    io = lambda spec, optional: [{"name": n, "data_type": types[t], "dims": d,                 # noqa: E731
                                  **({"optional": True} if optional and n != "text_input" else {})}
                                 for n, t, d in spec]
    return {"name": model, "platform": PLATFORM, "backend": BACKEND, "max_batch_size": 0,
            "input": io(INPUTS, True), "output": io(OUTPUTS, False),
            "model_transaction_policy": {"decoupled": True},
            "instance_group": [{"kind": "KIND_MODEL", "count": 1}]}
