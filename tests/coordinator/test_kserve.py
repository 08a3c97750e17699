"""The KServe v2 / Triton inference protocol on the coordinator, with Triton's own client
(`tritonclient.http`, unmodified) as the oracle: health, metadata, config, `infer` with binary and
JSON tensors, the generate extension and its stream — the same tokens as `/v1/completions` —
and every malformed request refused with a 4xx in Triton's error shape."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

PROMPT = "def add(a, b):\n    return"
GREEDY = {"max_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def client(coordinator):
    c = triton.InferenceServerClient(url=coordinator.url.removeprefix("http://"), network_timeout=60)
    yield c
    c.close()


@pytest.fixture(scope="module")
def http(coordinator):
    with httpx.Client(base_url=coordinator.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def expected(http, model_name) -> str:
    """What /v1/completions generates for PROMPT, greedily."""
    body = {"model": model_name, "prompt": PROMPT, **GREEDY}
    return http.post("/v1/completions", json=body).json()["choices"][0]["text"]


def text_input(*prompts: str) -> triton.InferInput:
    tensor = triton.InferInput("text_input", [len(prompts)], "BYTES")
    tensor.set_data_from_numpy(np.array([p.encode() for p in prompts], dtype=np.object_))
    return tensor


def sampling(**params) -> triton.InferInput:
    tensor = triton.InferInput("sampling_parameters", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([json.dumps(params).encode()], dtype=np.object_))
    return tensor


def flag(name: str, value: bool, binary: bool = True) -> triton.InferInput:
    tensor = triton.InferInput(name, [1], "BOOL")
    tensor.set_data_from_numpy(np.array([value]), binary_data=binary)
    return tensor


def test_health_metadata_and_config(client, model_name):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(model_name)
    assert not client.is_model_ready("no-such-model")
    server = client.get_server_metadata()
    assert server["name"] == "mindmotor" and "generate" in server["extensions"]
    meta = client.get_model_metadata(model_name)
    assert meta["platform"] == "mindmotor_llm" and meta["versions"] == ["1"]
    assert {"text_input", "sampling_parameters", "exclude_input_in_output"} <= {i["name"] for i in meta["inputs"]}
    assert {o["name"] for o in meta["outputs"]} >= {"text_output", "finish_reason"}
    config = client.get_model_config(model_name)
    assert config["model_transaction_policy"]["decoupled"] is True and config["max_batch_size"] == 0
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_model_metadata("no-such-model")


def test_infer_binary_and_json_give_the_completions_text(client, model_name, expected):
    """Binary tensors both ways (the client's default), then JSON both ways; the prompt is prepended
    unless exclude_input_in_output (Triton's vLLM backend)."""
    result = client.infer(model_name, [text_input(PROMPT), sampling(**GREEDY)])
    assert result.as_numpy("text_output").tolist() == [(PROMPT + expected).encode()]
    inputs = [text_input(PROMPT), sampling(**GREEDY), flag("exclude_input_in_output", True, binary=False),
              flag("return_num_output_tokens", True), flag("return_finish_reason", True)]
    inputs[0].set_data_from_numpy(np.array([PROMPT.encode()], dtype=np.object_), binary_data=False)
    outputs = [triton.InferRequestedOutput(n, binary_data=False)
               for n in ("text_output", "num_output_tokens", "finish_reason")]
    result = client.infer(model_name, inputs, outputs=outputs)
    assert result.as_numpy("text_output").tolist() == [expected]      # JSON data: text, not bytes
    assert result.as_numpy("num_output_tokens").tolist() == [8]
    assert result.as_numpy("finish_reason").tolist() == ["length"]
    batch = client.infer(model_name, [text_input(PROMPT, "x = 1"), sampling(**GREEDY),
                                      flag("exclude_input_in_output", True)])
    assert batch.as_numpy("text_output").shape == (2,) and batch.as_numpy("text_output")[0] == expected.encode()


def test_generate_and_generate_stream(http, model_name, expected):
    body = {"text_input": PROMPT, "parameters": {**GREEDY, "exclude_input_in_output": True}}
    answer = http.post(f"/v2/models/{model_name}/generate", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"model_name": model_name, "model_version": "1", "text_output": expected}
    with_prompt = http.post(f"/v2/models/{model_name}/generate", json={"text_input": PROMPT, "parameters": GREEDY})
    assert with_prompt.json()["text_output"] == PROMPT + expected
    pieces = []
    with http.stream("POST", f"/v2/models/{model_name}/generate_stream",
                     json={"text_input": PROMPT, "parameters": GREEDY, "return_finish_reason": True}) as stream:
        assert stream.status_code == 200
        for line in stream.iter_lines():
            if line.startswith("data: "):
                pieces.append(json.loads(line[6:]))
    assert "".join(p["text_output"] for p in pieces) == expected
    assert pieces[-1]["finish_reason"] == "length" and all(p["model_name"] == model_name for p in pieces)


@pytest.mark.parametrize("path, body, status, says", [
    ("generate", {"text_input": PROMPT, "parameters": {"temprature": 0}}, 400, "temprature"),
    ("generate", {"text_input": PROMPT, "parameters": {"temperature": 9}}, 400, "temperature"),
    ("generate", {"text_input": 5}, 400, "text_input"),
    ("generate", {"text_input": PROMPT, "what": 1}, 400, "what"),
    ("generate_stream", {"text_input": PROMPT, "exclude_input_in_output": False}, 400, "exclude_input_in_output"),
    ("generate", {"text_input": PROMPT, "stream": True}, 400, "generate_stream"),
    ("infer", {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [2], "data": ["a"]}]}, 400,
     "shape"),
    ("infer", {"inputs": [{"name": "text_input", "datatype": "INT9", "shape": [1], "data": [1]}]}, 400, "datatype"),
    ("infer", {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
               "outputs": [{"name": "logits"}]}, 400, "logits"),
    ("infer", {"inputs": []}, 400, "inputs"),
])
def test_bad_requests_get_triton_errors(http, model_name, path, body, status, says):
    response = http.post(f"/v2/models/{model_name}/{path}", json=body)
    assert response.status_code == status, response.text
    assert says in response.json()["error"]


def test_malformed_binary_data_and_unknown_models(http, model_name):
    header = json.dumps({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                                     "parameters": {"binary_data_size": 40}}]}).encode()
    cut = http.post(f"/v2/models/{model_name}/infer", content=header + b"\x05\x00\x00\x00ab",
                    headers={"Inference-Header-Content-Length": str(len(header))})
    assert cut.status_code == 400 and "binary_data_size" in cut.json()["error"]
    lying = http.post(f"/v2/models/{model_name}/infer", content=b"{}", headers={"Inference-Header-Content-Length": "99"})
    assert lying.status_code == 400 and "Inference-Header-Content-Length" in lying.json()["error"]
    assert http.post("/v2/models/nope/generate", json={"text_input": "x"}).status_code == 404
    assert http.get(f"/v2/models/{model_name}/versions/7").status_code == 404
    assert http.get(f"/v2/models/{model_name}/versions/1").json()["name"] == model_name
