"""Structured outputs in the engine (llguidance): each constrained sequence's logits are masked per
step inside continuous batching. A batch of 64, half constrained and half free: every constrained
output parses and follows its schema, every free one equals an unconstrained run token for token.
Regex, choice and grammar constraints; preemption and resumption (the grammar state rebuilt from
the output produced elsewhere) leave the output unchanged."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from mindmotor import LLM, SamplingParams
from mindmotor.engine.continuation import Continuation
from mindmotor.engine.grammar import Constraint, advance
from mindmotor.engine.llm_engine import RequestError

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 3},
        "size": {"type": "object", "properties": {"w": {"type": "integer", "minimum": 0, "maximum": 99}},
                 "required": ["w"], "additionalProperties": False},
    },
    "required": ["name", "color", "tags", "size"],
    "additionalProperties": False,
}
JSON = Constraint("json", json.dumps(SCHEMA))


def follows_schema(obj) -> bool:
    return (set(obj) == {"name", "color", "tags", "size"} and isinstance(obj["name"], str)
            and len(obj["name"]) <= 6 and obj["color"] in ("red", "green", "blue")
            and isinstance(obj["tags"], list) and len(obj["tags"]) <= 3
            and all(isinstance(t, str) and len(t) <= 3 for t in obj["tags"])
            and set(obj["size"]) == {"w"} and isinstance(obj["size"]["w"], int) and 0 <= obj["size"]["w"] <= 99)


@pytest.fixture(scope="module")
def llm(tiny_ckpt):
    return LLM(model=str(tiny_ckpt), block_size=4, max_num_seqs=64)


def test_half_constrained_batch_of_64(llm):
    prompts = [f"item {i}:" for i in range(64)]
    free = [SamplingParams(max_tokens=24, temperature=1.0, seed=i, ignore_eos=True) for i in range(64)]
    params = [SamplingParams(max_tokens=200, temperature=1.0, seed=i, structured=JSON) if i % 2 else free[i]
              for i in range(64)]
    mixed = llm.generate(prompts, params)
    alone = llm.generate(prompts[0::2], free[0::2])
    for i, out in enumerate(mixed):
        if i % 2:
            assert out.finish_reason == "stop", out.text
            assert follows_schema(json.loads(out.text)), out.text
        else:
            assert out.token_ids == alone[i // 2].token_ids
    assert llm.engine.grammar.masked_rows > 0


@pytest.mark.parametrize("constraint, check", [
    (Constraint("regex", r"[a-c]{2,5}-\d{2}"), lambda t: re.fullmatch(r"[a-c]{2,5}-\d{2}", t)),
    (Constraint("choice", json.dumps(["alpha", "beta", "gamma delta"])), lambda t: t in ("alpha", "beta", "gamma delta")),
    (Constraint("grammar", 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9]'),
     lambda t: re.fullmatch(r"\([1-9](\+[1-9])*\)", t)),
    # any JSON object: a random model rarely closes one, so a bounded object schema stands in here
    (Constraint("json", json.dumps({"type": "object", "properties": {"k": {"type": "boolean"}}, "required": ["k"],
                                    "additionalProperties": False})), lambda t: json.loads(t) in ({"k": True}, {"k": False})),
])
def test_regex_choice_grammar_and_json_object(llm, constraint, check):
    outs = llm.generate([f"go {i}" for i in range(6)],
                        [SamplingParams(max_tokens=200, temperature=1.0, seed=i, structured=constraint)
                         for i in range(6)])
    for out in outs:
        assert out.finish_reason == "stop" and check(out.text), out.text


def test_bad_constraints_are_refused_naming_the_field(llm):
    """Cheap faults when the params are made; a spec that does not compile when the engine takes
    the request (it compiles only there, on its large-stack thread, or in a helper process)."""
    for bad in (Constraint("json", "{not json"), Constraint("choice", "[]"), Constraint("xml", "")):
        with pytest.raises(ValueError) as info:
            SamplingParams(structured=bad)
        assert info.value.param == "structured_outputs"
    for bad in (Constraint("regex", "[a-", "guided_regex"), Constraint("grammar", "root ::= (", "guided_grammar")):
        with pytest.raises(RequestError, match="constraint is not valid") as info:
            llm.generate(["x"], SamplingParams(structured=bad))
        assert info.value.param == bad.param
    assert llm.generate(["x"], SamplingParams(max_tokens=3))[0].token_ids      # the engine goes on


def test_preemption_and_resumption_keep_the_output(tiny_ckpt, llm):
    params = SamplingParams(max_tokens=100, temperature=1.0, seed=7, structured=JSON)
    prompt = "the thing:"
    whole = llm.generate([prompt], params)[0]
    assert whole.finish_reason == "stop" and follows_schema(json.loads(whole.text))
    small = LLM(model=str(tiny_ckpt), block_size=4, num_blocks=64, max_num_seqs=8)
    crowded = small.generate([prompt] * 8, [params] * 8)
    assert small.engine.scheduler.num_preemptions > 0
    assert all(o.token_ids == whole.token_ids for o in crowded)
    # moved after 5 tokens: the other instance rebuilds the grammar from them
    engine = llm.engine
    engine.add_request("moved", prompt, params, continuation=Continuation(whole.token_ids[:5]))
    rest = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            rest.extend(out.new_token_ids)
    assert whole.token_ids[:5] + rest == whole.token_ids
    with pytest.raises(RequestError, match="structured output"):
        engine.add_request("wrong", prompt, params, continuation=Continuation([llm.tokenizer.encode("zz")[0]] * 3))


def _reference_mask(engine, matchers, logits):
    """Each row's allowed tokens, straight from llguidance one matcher at a time."""
    out = logits.copy()
    for row, m in enumerate(matchers):
        bits = np.frombuffer(m.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[:logits.shape[1]].astype(bool)
        out[row, ~allowed] = -np.inf
    return out


@pytest.mark.parametrize("overlap", [True, False])
def test_masks_prefetched_or_not_equal_llguidance_per_row(llm, overlap):
    engine = llm.engine.grammar
    tok = llm.tokenizer
    matchers = [engine.matcher(JSON), engine.matcher(Constraint("regex", "[0-9]{2,4}")), engine.matcher(JSON)]
    advance(matchers[2], tok.encode('{"name":"ab'))
    logits = np.random.default_rng(0).standard_normal((5, engine.vocab_size)).astype(np.float32)
    rows = [0, 2, 4]                                   # rows 1 and 3 are free
    expected = logits.copy()
    expected[rows] = _reference_mask(engine, matchers, logits[rows])
    engine.overlap = overlap
    try:
        engine.prefetch(matchers)
        masked = engine.masked(logits, rows, matchers)
    finally:
        engine.overlap = True
    assert np.array_equal(masked, expected)
    assert np.isfinite(masked[[1, 3]]).all() and not np.isfinite(masked[rows]).all()


def test_a_prefetch_for_other_matchers_is_not_used(llm):
    engine = llm.engine.grammar
    a, b = engine.matcher(Constraint("regex", "a+")), engine.matcher(Constraint("regex", "[0-9]+"))
    logits = np.zeros((1, engine.vocab_size), dtype=np.float32)
    engine.prefetch([a])
    assert np.array_equal(engine.masked(logits, [0], [b]), _reference_mask(engine, [b], logits))
