"""A request resumed after output produced elsewhere (a `Continuation` without KV: its instance failed) goes on
exactly as an undisturbed run: the same seeded draws, penalties and token limits over the whole
output, the text after what the client already has — also through preemption; bad resumed input
is refused."""

from __future__ import annotations

import numpy as np
import pytest

from mindmotor.common.tokenizer import Tokenizer
from mindmotor.engine.config import EngineConfig
from mindmotor.engine.continuation import Continuation
from mindmotor.engine.llm_engine import LLMEngine, RequestError
from mindmotor.engine.output import OutputProcessor, RequestOutput
from mindmotor.rules.sampling_params import SamplingParams
from mindmotor.engine.sequence import Sequence

SEEDED = dict(temperature=1.0, top_p=0.9, presence_penalty=0.6, frequency_penalty=0.4, ignore_eos=True)
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def engines(tiny_ckpt):
    def make(**options) -> LLMEngine:
        options.setdefault("num_blocks", 128)
        return LLMEngine(EngineConfig(model=str(tiny_ckpt), block_size=4, **options))
    return make


def run(engine: LLMEngine) -> dict[str, list[RequestOutput]]:
    outputs: dict[str, list[RequestOutput]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
        engine.check_invariants()
    return outputs


def tokens(outputs: list[RequestOutput]) -> list[int]:
    return [t for out in outputs for t in out.new_token_ids]


def text(outputs: list[RequestOutput]) -> str:
    return "".join(out.new_text for out in outputs)


def prompts(n: int, length: int, seed: int = 5) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 300, length + 2 * i).tolist() for i in range(n)]


def resume(engine: LLMEngine, rid: str, prompt: list[int], undisturbed: list[RequestOutput], k: int,
           params: SamplingParams) -> None:
    """Resume after the first k outputs of an undisturbed run (one token each), with the text its
    client was sent."""
    engine.add_request(rid, prompt, params,
                       continuation=Continuation(tokens(undisturbed[:k]), len(text(undisturbed[:k]))))


@pytest.mark.parametrize("k", [1, 6, 19, MAX_TOKENS - 1])
def test_a_resumed_seeded_request_continues_exactly(engines, k):
    params = SamplingParams(max_tokens=MAX_TOKENS, seed=1234, **SEEDED)
    prompt = prompts(1, 11)[0]
    engine = engines()
    engine.add_request("u", prompt, params)
    undisturbed = run(engine)["u"]
    assert len(undisturbed) == MAX_TOKENS

    resume(engine, "r", prompt, undisturbed, k, params)
    resumed = run(engine)["r"]

    assert [len(out.new_token_ids) for out in resumed] == [1] * (MAX_TOKENS - k)   # none repeated
    assert tokens(resumed) == tokens(undisturbed)[k:]
    assert text(undisturbed[:k]) + text(resumed) == text(undisturbed)
    assert resumed[-1].finish_reason == "length" and resumed[-1].num_output_tokens == MAX_TOKENS
    assert resumed[-1].num_prompt_tokens == len(prompt)


def test_resubmitting_the_output_as_prompt_would_not_continue(engines):
    """The defect this fixes: the produced tokens as prompt restart the draws and the penalties."""
    params = SamplingParams(max_tokens=MAX_TOKENS, seed=1234, **SEEDED)
    prompt, k = prompts(1, 11)[0], 6
    engine = engines()
    engine.add_request("u", prompt, params)
    expected = tokens(run(engine)["u"])
    engine.add_request("naive", prompt + expected[:k], SamplingParams(max_tokens=MAX_TOKENS - k, seed=1234, **SEEDED))
    assert tokens(run(engine)["naive"]) != expected[k:]


def test_resumed_requests_continue_exactly_through_preemption(engines):
    """A pool too small for the batch: resumed requests are preempted and recomputed (prompt +
    every output) like any other, and still continue their seeded streams exactly."""
    params = [SamplingParams(max_tokens=24, seed=100 + i, **SEEDED) for i in range(5)]
    batch = prompts(5, 9)
    roomy = engines()
    for i, (prompt, p) in enumerate(zip(batch, params)):
        roomy.add_request(f"u{i}", prompt, p)
    undisturbed = run(roomy)

    tiny = engines(num_blocks=20, max_num_batched_tokens=24)
    cuts = [0, 3, 8, 15, 21]
    for i, (prompt, p, k) in enumerate(zip(batch, params, cuts)):
        if k:
            resume(tiny, f"r{i}", prompt, undisturbed[f"u{i}"], k, p)
        else:
            tiny.add_request(f"r{i}", prompt, p)
    resumed = run(tiny)

    assert tiny.stats().num_preemptions > 0, "the tiny pool was meant to force preemption"
    for i, k in enumerate(cuts):
        assert tokens(resumed[f"r{i}"]) == tokens(undisturbed[f"u{i}"])[k:], i
        assert text(undisturbed[f"u{i}"][:k]) + text(resumed[f"r{i}"]) == text(undisturbed[f"u{i}"]), i
    assert tiny.stats().num_running == tiny.stats().num_waiting == 0
    assert tiny.block_manager.num_free_blocks == tiny.block_manager.num_blocks


def test_min_tokens_counts_the_resumed_output(engines):
    """A stop token that may end the request at output 4 (min_tokens 3) ends the resumed one there
    too: the 2 resumed tokens count towards min_tokens."""
    engine = engines()
    prompt = prompts(1, 13)[0]
    greedy = dict(temperature=0.0, max_tokens=12)
    engine.add_request("base", prompt, SamplingParams(ignore_eos=True, **greedy))
    base = tokens(run(engine)["base"])
    stop = base[3]
    assert stop not in base[:3], "choose a prompt whose 4th greedy token is new"
    params = SamplingParams(stop_token_ids=[stop], min_tokens=3, **greedy)

    engine.add_request("r", prompt, params, continuation=Continuation(base[:2]))
    resumed = run(engine)["r"]

    assert tokens(resumed) == base[2:4]
    assert (resumed[-1].finish_reason, resumed[-1].stop_reason) == ("stop", stop)


def test_a_stop_string_that_straddles_the_move_ends_the_text_exactly(engines):
    params = SamplingParams(max_tokens=MAX_TOKENS, seed=77, **SEEDED)
    prompt = prompts(1, 12)[0]
    engine = engines()
    engine.add_request("plain", prompt, params)
    plain = run(engine)["plain"]
    k = 10
    at = len(text(plain[:k]))
    stop = text(plain)[at - 2:at + 2]                  # begins in the first k tokens' text, ends after
    assert len(stop) == 4 and text(plain).find(stop) == at - 2, "choose a seed without an earlier match"
    with_stop = SamplingParams(max_tokens=MAX_TOKENS, seed=77, stop=[stop], **SEEDED)
    engine.add_request("u", prompt, with_stop)
    undisturbed = run(engine)["u"]
    assert len(text(undisturbed[:k])) < at             # the start of the stop string was held back

    resume(engine, "r", prompt, undisturbed, k, with_stop)
    resumed = run(engine)["r"]

    assert text(undisturbed[:k]) + text(resumed) == text(undisturbed) == text(plain)[:at - 2]
    assert (resumed[-1].finish_reason, resumed[-1].stop_reason) == ("stop", stop)
    assert tokens(resumed) == tokens(undisturbed)[k:]


# ---- the text after the move, token by token (no model) -----------------------------------------
@pytest.fixture(scope="module")
def tok(tiny_ckpt):
    return Tokenizer.from_dir(tiny_ckpt)


def stream_text(tok: Tokenizer, prompt: list[int], ids: list[int], params: SamplingParams,
                resumed: tuple[list[int], int] | None = None) -> list[str]:
    """The text of each output while `ids` are generated after `prompt` (and after `resumed`
    output tokens, with its characters already sent), up to the one that finishes."""
    outputs = OutputProcessor(tok, tok.eos_token_ids, 1024)
    seq = Sequence("s", prompt, params, arrival_time=0.0, max_total_tokens=1024)
    outputs.add(seq)
    if resumed is not None:
        outputs.resume(seq, *resumed)
    texts = []
    for token in ids:
        status = outputs.on_token(seq, token)
        if status is not None:
            seq.status = status
        texts.append(outputs.make_output(seq, [token], []).new_text)
        if status is not None:
            break
    return texts


def byte_split_point(tok: Tokenizer, ids: list[int]) -> int:
    """An index where `ids[:i]` ends inside a multi-byte character."""
    for i in range(1, len(ids)):
        if tok.decode(ids[:i]).endswith("\ufffd"):
            return i
    raise AssertionError("the test input must split a multi-byte character between tokens; "
                         "choose a text whose characters the tiny tokenizer does not merge")


def test_a_character_split_across_the_move_is_completed(tok):
    prompt, ids = tok.encode("Say: "), tok.encode("ab 你好 😀 cd")
    params = SamplingParams(max_tokens=len(ids))
    cut = byte_split_point(tok, ids)
    undisturbed = stream_text(tok, prompt, ids, params)
    sent = "".join(undisturbed[:cut])

    rest = stream_text(tok, prompt, ids[cut:], params, resumed=(ids[:cut], len(sent)))

    assert rest == undisturbed[cut:]
    assert sent + "".join(rest) == "ab 你好 😀 cd"


def test_held_back_text_is_released_or_cut_at_a_stop_string_after_the_move(tok):
    prompt, ids = tok.encode("x"), tok.encode("hello world, stop here")
    cut = len(tok.encode("hello wor"))
    for stop, expected in (("world", "hello "), ("zzz", "hello world, stop here")):
        params = SamplingParams(max_tokens=len(ids), stop=[stop])
        undisturbed = stream_text(tok, prompt, ids, params)
        sent = "".join(undisturbed[:cut])
        assert len(sent) < len("hello wor")                        # " wor" may begin the stop string

        rest = stream_text(tok, prompt, ids[cut:], params, resumed=(ids[:cut], len(sent)))

        assert sent + "".join(rest) == "".join(undisturbed) == expected


# ---- validation ------------------------------------------------------------------------------
@pytest.mark.parametrize("output, max_tokens, sent_chars, message", [
    ([1, 4000], 8, 0, r"continuation output token ids \[4000\] are outside the vocabulary"),
    ([1, -2], 8, 0, r"continuation output token ids \[-2\]"),
    ([1, 2, 3], 3, 0, "the output so far has 3 tokens, but max_tokens is 3"),
    ([5] * 20, None, 0, "fill this model's maximum context length"),
    ([5, 6], 8, 10**6, r"sent_chars \(1000000\) is outside the text of the output so far"),
])
def test_bad_resumed_output_is_refused(engines, output, max_tokens, sent_chars, message):
    engine = engines(num_blocks=8)                                   # context: 32 tokens
    with pytest.raises(RequestError, match=message):
        engine.validate([7] * 12, SamplingParams(max_tokens=max_tokens), Continuation(output, sent_chars))


def test_validate_returns_the_prompt_tokenized_with_its_continuation(engines):
    engine = engines()
    validated = engine.validate("hello", SamplingParams(max_tokens=None), Continuation((3, 4)))
    assert validated.prompt_token_ids == engine.tokenizer.encode("hello")
    assert validated.continuation == Continuation((3, 4), 0)
    assert validated.params.max_tokens == engine.max_model_len - len(validated.prompt_token_ids)
