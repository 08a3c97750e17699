"""Tensors of the KServe v2 protocol as they travel over HTTP: in the JSON body (`data`, a nested or
flat list) or, with Triton's binary tensor data extension, after the JSON header (the header's
length in `Inference-Header-Content-Length`, each tensor's byte count in its
`parameters.binary_data_size`, BYTES elements as a 4-byte little-endian length then the bytes).

`decode_request` checks everything a client could get wrong — the header length, shapes against
the element count, datatypes, truncated binary data — and raises `TensorError` with the reason;
`encode_response` writes outputs as JSON or binary, as each output (or the request) asked."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from math import prod

HEADER_LENGTH = "inference-header-content-length"
# KServe v2 datatypes of fixed size: their struct codes (little-endian; the coordinator loads no numpy)
_FIXED = {"BOOL": "?", "UINT8": "B", "UINT16": "H", "UINT32": "I", "UINT64": "Q",
          "INT8": "b", "INT16": "h", "INT32": "i", "INT64": "q", "FP16": "e", "FP32": "f", "FP64": "d"}
DATATYPES = frozenset(_FIXED) | {"BYTES"}
MAX_ELEMENTS = 4096            # per tensor: prompts of one request, far beyond any batch we admit


class TensorError(ValueError):
    """The request's tensors are malformed; the message says how (a 400)."""


@dataclass
class Tensor:
    name: str
    datatype: str
    shape: list[int]
    values: list                # flat, row-major: str for BYTES (UTF-8), bool/int/float otherwise


@dataclass
class InferRequest:
    id: str = ""
    inputs: dict[str, Tensor] = field(default_factory=dict)
    outputs: list[dict] | None = None        # the requested outputs ({"name", "parameters"}); None: all
    parameters: dict = field(default_factory=dict)

    def binary_output(self, name: str) -> bool:
        """Whether output `name` goes back as binary data (its own `binary_data`, else the request's
        `binary_data_output`)."""
        for output in self.outputs or ():
            if output.get("name") == name:
                return bool((output.get("parameters") or {}).get("binary_data", False))
        return bool(self.parameters.get("binary_data_output", False))


def decode_request(body: bytes, header_length: str | None) -> InferRequest:
    header, binary = _split(body, header_length)
    try:
        doc = json.loads(header)
    except ValueError as exc:
        raise TensorError(f"the inference request is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise TensorError("the inference request must be a JSON object")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise TensorError("the inference request needs a non-empty 'inputs' list")
    outputs = doc.get("outputs")
    if outputs is not None and not (isinstance(outputs, list) and all(isinstance(o, dict) for o in outputs)):
        raise TensorError("'outputs' must be a list of objects")
    parameters = doc.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise TensorError("'parameters' must be an object")
    request = InferRequest(id=str(doc.get("id", ""))[:128], outputs=outputs, parameters=parameters)
    offset = 0
    for item in inputs:
        tensor, offset = _input(item, binary, offset)
        if tensor.name in request.inputs:
            raise TensorError(f"input {tensor.name!r} is given twice")
        request.inputs[tensor.name] = tensor
    if offset != len(binary):
        raise TensorError(f"{len(binary) - offset} bytes of binary data follow the inputs that no input claims")
    return request


def _split(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    if header_length is None:
        return body, b""
    if not header_length.strip().isdigit() or int(header_length) > len(body):
        raise TensorError(f"Inference-Header-Content-Length {header_length!r} is not a length within the body")
    n = int(header_length)
    return body[:n], body[n:]


def _input(item, binary: bytes, offset: int) -> tuple[Tensor, int]:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise TensorError("each input must be an object with a 'name'")
    name, datatype, shape = item["name"], item.get("datatype"), item.get("shape")
    if datatype not in DATATYPES:
        raise TensorError(f"input {name!r}: datatype {datatype!r} is not one of {sorted(DATATYPES)}")
    if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise TensorError(f"input {name!r}: 'shape' must be a list of non-negative integers")
    count = prod(shape)
    if count > MAX_ELEMENTS:
        raise TensorError(f"input {name!r}: {count} elements is more than the {MAX_ELEMENTS} allowed")
    size = (item.get("parameters") or {}).get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or size < 0 or offset + size > len(binary):
            raise TensorError(f"input {name!r}: binary_data_size {size!r} runs past the data sent")
        values = _from_binary(name, datatype, binary[offset:offset + size], count)
        offset += size
    elif "data" in item:
        values = _flatten(item["data"])
        values = [_json_value(name, datatype, v) for v in values]
    else:
        raise TensorError(f"input {name!r} has neither 'data' nor binary data")
    if len(values) != count:
        raise TensorError(f"input {name!r}: shape {shape} holds {count} elements, {len(values)} were given")
    return Tensor(name, datatype, shape, values), offset


def _flatten(data) -> list:
    if not isinstance(data, list):
        return [data]
    out: list = []
    for value in data:
        out.extend(_flatten(value))
    return out


def _json_value(name: str, datatype: str, value):
    if datatype == "BYTES":
        if not isinstance(value, str):
            raise TensorError(f"input {name!r}: BYTES elements in JSON must be strings")
        return value
    if datatype == "BOOL":
        if not isinstance(value, bool):
            raise TensorError(f"input {name!r}: BOOL elements must be true or false")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TensorError(f"input {name!r}: {datatype} elements must be numbers")
    if datatype.startswith(("INT", "UINT")) and not float(value).is_integer():
        raise TensorError(f"input {name!r}: {datatype} elements must be integers")
    return int(value) if datatype.startswith(("INT", "UINT")) else float(value)


def _from_binary(name: str, datatype: str, raw: bytes, count: int) -> list:
    if datatype != "BYTES":
        layout = f"<{count}{_FIXED[datatype]}"
        if len(raw) != struct.calcsize(layout):
            raise TensorError(f"input {name!r}: {len(raw)} bytes of binary data for {count} {datatype} elements")
        return list(struct.unpack(layout, raw))
    values, at = [], 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise TensorError(f"input {name!r}: BYTES data ends inside an element's length")
        (n,) = struct.unpack_from("<I", raw, at)
        if at + 4 + n > len(raw):
            raise TensorError(f"input {name!r}: a BYTES element runs past the data sent")
        try:
            values.append(raw[at + 4:at + 4 + n].decode("utf-8"))
        except UnicodeDecodeError:
            raise TensorError(f"input {name!r}: BYTES elements must be UTF-8 text") from None
        at += 4 + n
    return values


def to_bytes(tensor: Tensor) -> bytes:
    """The binary form of an output tensor."""
    if tensor.datatype == "BYTES":
        return b"".join(struct.pack("<I", len(b)) + b for b in (v.encode("utf-8") for v in tensor.values))
    return struct.pack(f"<{len(tensor.values)}{_FIXED[tensor.datatype]}", *tensor.values)


def encode_response(model: str, version: str, request: InferRequest, outputs: list[Tensor]
                    ) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers: outputs asked for as binary go after the JSON header."""
    wanted = {o.get("name") for o in request.outputs} if request.outputs else None
    docs, blobs = [], []
    for tensor in outputs:
        if wanted is not None and tensor.name not in wanted:
            continue
        doc = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        if request.binary_output(tensor.name):
            blob = to_bytes(tensor)
            doc["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            doc["data"] = tensor.values
        docs.append(doc)
    header = {"model_name": model, "model_version": version, "outputs": docs}
    if request.id:
        header["id"] = request.id
    head = json.dumps(header, ensure_ascii=False).encode()
    if not blobs:
        return head, {"content-type": "application/json"}
    return head + b"".join(blobs), {"content-type": "application/octet-stream",
                                    HEADER_LENGTH: str(len(head))}
