"""LoRA adapters through the OpenAI API: two real workers of the base model (one serving an adapter
from the start), a coordinator over them; adapters listed with their parent, selected by `model`,
routed to the workers holding them; loaded and unloaded at run time by the admin (fanned out);
unknown → 404, corrupt → 400 with the reason, nothing else changed."""

from __future__ import annotations

import threading

import httpx
import numpy as np
import pytest

from mindmotor.common.waiting import wait_until
from mindmotor.model.llama import LlamaModel
from mindmotor.model.lora import load_adapter
from mindmotor.model.testing import write_random_adapter
from mindmotor.protocol import worker_pb2 as pb

from .processes import start_workers

ADMIN = "admin-secret-for-lora"
PROMPT = [5, 17, 99, 3, 250, 41, 8]


def greedy(model, adapter, n: int = 5) -> list[int]:
    ids = list(PROMPT)
    for _ in range(n):
        ids.append(int(np.argmax(model.forward_dense(ids, adapter)[-1])))
    return ids[len(PROMPT):]


@pytest.fixture(scope="module")
def setup(tiny_ckpt, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-http")
    config = LlamaModel.from_pretrained(tiny_ckpt).config
    paths = {n: write_random_adapter(root / n, config, seed=i) for i, n in enumerate(("sql", "poet"))}
    broken = root / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8, "lora_alpha": 16, "use_dora": true}')
    workers = start_workers(tiny_ckpt, root, 2, "--timing", "virtual", "--enable-lora")
    # only the first serves "sql" (as if started with --lora-modules sql=...)
    workers[0].stub.LoadLoraAdapter(pb.LoadLoraAdapterRequest(lora_name="sql", lora_path=str(paths["sql"])),
                                    timeout=10)
    yield paths, broken, workers
    for w in workers:
        w.stop()


def completion(client, model: str, n: int = 5):
    return client.post("/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": n,
                                                "temperature": 0, "ignore_eos": True, "return_tokens_as_token_ids": True})


def tokens(response) -> list[int]:
    return [int(t.split(":")[1]) for t in response.json()["choices"][0]["logprobs"]["tokens"]]


def test_adapters_through_the_api(setup, make_coordinator, tiny_ckpt, model_name):
    paths, broken, workers = setup
    c = make_coordinator(workers=[w.address for w in workers], admin_token=ADMIN, lora_poll_interval_s=0.2)
    model = LlamaModel.from_pretrained(tiny_ckpt)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=c.url, timeout=30) as client:
        wait_until(lambda: any(m["id"] == "sql" for m in client.get("/v1/models").json()["data"])
                   and len(c.coordinator.table.candidates(model_name)) == 2, timeout=10)
        cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        assert cards["sql"]["parent"] == model_name and cards[model_name]["parent"] is None
        assert client.get("/v1/models/sql").json()["parent"] == model_name

        def logprob_tokens(name):
            r = client.post("/v1/completions", json={"model": name, "prompt": PROMPT, "max_tokens": 5,
                                                     "temperature": 0, "ignore_eos": True, "logprobs": 0,
                                                     "return_tokens_as_token_ids": True})
            assert r.status_code == 200, r.text
            assert r.json()["model"] == name                 # the adapter's name, as vLLM answers
            return tokens(r)

        sql = load_adapter(paths["sql"], model.config, 16)
        for _ in range(3):           # only the worker holding it serves it: always the adapter's tokens
            assert logprob_tokens("sql") == greedy(model, sql)
        assert logprob_tokens(model_name) == greedy(model, None)
        chat = client.post("/v1/chat/completions", json={"model": "sql", "max_tokens": 3,
                                                        "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 200 and chat.json()["model"] == "sql"

        missing = completion(client, "poet")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"

        # requests of the base and of "sql" go on through every load and unload below: none may fail
        stop, statuses = threading.Event(), []

        def steady():
            with httpx.Client(base_url=c.url, timeout=30) as other:
                while not stop.is_set():
                    for name in ("sql", model_name):
                        statuses.append(completion(other, name, n=3).status_code)

        load = threading.Thread(target=steady)
        load.start()
        # the steady requests are under way before the first load (on a busy host its first answer
        # can come after every load and unload below: then nothing would have been checked)
        wait_until(lambda: len(statuses) >= 2, timeout=60, what="the steady requests under way")
        assert client.post("/v1/load_lora_adapter", json={"lora_name": "poet", "lora_path": str(paths["poet"])}
                           ).status_code == 401                                  # no admin token
        bad = client.post("/v1/load_lora_adapter", json={"lora_name": "poet", "lora_path": str(broken)}, headers=admin)
        assert bad.status_code == 400 and "DoRA" in bad.json()["error"]["message"]
        assert completion(client, "poet").status_code == 404                     # nothing changed
        ok = client.post("/v1/load_lora_adapter", json={"lora_name": "poet", "lora_path": str(paths["poet"]),
                                                        "load_inplace": True}, headers=admin)
        assert ok.status_code == 200 and ok.json()["instances"] == 2, ok.text
        assert ok.headers["x-mindmotor-ignored-fields"] == "load_inplace"   # ignored and named, as everywhere
        assert logprob_tokens("poet") == greedy(model, load_adapter(paths["poet"], model.config, 16))

        gone = client.post("/v1/unload_lora_adapter", json={"lora_name": "poet", "lora_int_id": 2, "force": True},
                           headers=admin)
        assert gone.status_code == 200 and gone.json()["instances"] == 2
        assert gone.headers["x-mindmotor-ignored-fields"] == "force"
        assert completion(client, "poet").status_code == 404
        assert client.post("/v1/unload_lora_adapter", json={"lora_name": "poet"}, headers=admin).status_code == 404
        after = len(statuses)
        wait_until(lambda: len(statuses) >= after + 2, timeout=60, what="steady requests after the unload")
        stop.set()
        load.join()
        assert statuses and set(statuses) == {200}
        assert logprob_tokens("sql") == greedy(model, sql) and logprob_tokens(model_name) == greedy(model, None)


def test_the_router_hashes_an_adapters_prompt_as_the_engine_keys_it():
    """Cache-aware routing: a prompt under an adapter has the adapter's block hashes (never the
    base's), the same the engine's prefix cache registers (engine/lora_slots.py AdapterRecord)."""
    from mindmotor.common.block_hash import block_hashes
    from mindmotor.coordinator.routing.policies.base import RouteRequest
    from mindmotor.engine.lora_slots import AdapterRecord

    prompt = list(range(40))
    base, sql = RouteRequest(prompt), RouteRequest(prompt, lora="sql")
    record = AdapterRecord("sql", "/p", 8, ("q_proj",), 0)
    assert sql.block_hashes(16) == block_hashes(prompt, 16, root=record.hash_root)
    assert not set(sql.block_hashes(16)) & set(base.block_hashes(16))
    assert AdapterRecord("sql", "/p", 8, ("q_proj",), 0, epoch=2).hash_root != record.hash_root
