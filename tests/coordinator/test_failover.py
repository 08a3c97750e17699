"""A worker that dies (SIGKILL) or drains with its requests aborted in the middle of streams: every
stream continues on the other worker from where it was — the text of each equals an undisturbed
run, no token lost or repeated; seeded sampling with penalties too."""

from __future__ import annotations

import threading

import openai
import pytest

from .processes import REALTIME_ARGS, InProcessCoordinator, start_workers, wait_until

NUM_STREAMS = 6
MAX_TOKENS = 120                       # ~1.8 s at ~15 ms per step: long enough to cut in the middle
PROMPTS = [f"Stream number {i} tells a story about the sea" for i in range(NUM_STREAMS)]
GREEDY = dict(temperature=0.0, max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True})
SEEDED = dict(temperature=0.8, top_p=0.95, seed=2024, presence_penalty=0.4, frequency_penalty=0.3, logprobs=0,
              max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True})


@pytest.fixture
def two_realtime_workers(tiny_ckpt, tmp_path):
    workers = start_workers(tiny_ckpt, tmp_path, 2, *REALTIME_ARGS, "--drain-timeout", "0.2")
    yield workers
    for w in workers:
        w.stop()


def undisturbed_choices(coordinator, model_name: str, sampling: dict) -> list:
    """The reference choices: the same requests on the (virtual) shared coordinator."""
    client = openai.OpenAI(base_url=coordinator.base_url, api_key="x", max_retries=0)
    return [client.completions.create(model=model_name, prompt=p, **sampling).choices[0] for p in PROMPTS]


@pytest.fixture
def undisturbed(coordinator, model_name):
    return [choice.text for choice in undisturbed_choices(coordinator, model_name, GREEDY)]


class Streams:
    """NUM_STREAMS streaming completions, each read on its own thread."""

    def __init__(self, base_url: str, model: str, sampling: dict = GREEDY):
        self.chunks: list[list] = [[] for _ in PROMPTS]
        self.errors: list[BaseException] = []
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=60)

        def read(i: int) -> None:
            try:
                for chunk in client.completions.create(model=model, prompt=PROMPTS[i], stream=True,
                                                       stream_options={"include_usage": True}, **sampling):
                    self.chunks[i].append(chunk)
            except BaseException as exc:  # noqa: BLE001 - asserted by the test
                self.errors.append(exc)

        self.threads = [threading.Thread(target=read, args=(i,)) for i in range(NUM_STREAMS)]
        for t in self.threads:
            t.start()

    def all_started(self, min_chunks: int) -> bool:
        return all(len(c) >= min_chunks for c in self.chunks)

    def join(self) -> None:
        for t in self.threads:
            t.join(timeout=60)

    def texts(self) -> list[str]:
        return ["".join(c.choices[0].text for c in chunks if c.choices) for chunks in self.chunks]

    def tokens(self) -> list[list[str]]:
        """Each stream's tokens (their text, from the logprobs), when logprobs were asked."""
        return [[t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
                for chunks in self.chunks]


def check_all_continued(streams: Streams, undisturbed: list[str]) -> None:
    assert not streams.errors, streams.errors
    for i, chunks in enumerate(streams.chunks):
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finishes == ["length"], (i, finishes)
        assert chunks[-1].usage.completion_tokens == MAX_TOKENS
    assert streams.texts() == undisturbed


def test_sigkill_of_a_worker_mid_stream_loses_nothing(two_realtime_workers, undisturbed, model_name, tiny_ckpt):
    victim, survivor = two_realtime_workers
    c = InProcessCoordinator(workers=[w.address for w in two_realtime_workers],
                             model_dir=str(tiny_ckpt))
    try:
        streams = Streams(c.base_url, model_name)
        wait_until(lambda: streams.all_started(min_chunks=10), timeout=20)
        assert victim.status().load.running > 0 and survivor.status().load.running > 0

        victim.kill()
        streams.join()

        check_all_continued(streams, undisturbed)
        metrics = c.coordinator.metrics
        assert metrics.migrations.labels(model_name)._value.get() >= 1
        assert not c.coordinator.table.is_routable(c.coordinator.table.get(victim.address))
        wait_until(survivor.idle, timeout=5)
    finally:
        c.stop()


def test_sigkill_mid_stream_continues_seeded_sampling_exactly(two_realtime_workers, coordinator, model_name,
                                                            tiny_ckpt):
    """The survivor continues each moved request's seeded random stream, with the penalties of
    the tokens made before the move: the stream is that of an undisturbed run, token for token."""
    expected = undisturbed_choices(coordinator, model_name, SEEDED)
    victim, survivor = two_realtime_workers
    c = InProcessCoordinator(workers=[w.address for w in two_realtime_workers], model_dir=str(tiny_ckpt))
    try:
        streams = Streams(c.base_url, model_name, SEEDED)
        wait_until(lambda: streams.all_started(min_chunks=10), timeout=20)
        assert victim.status().load.running > 0

        victim.kill()
        streams.join()

        check_all_continued(streams, [choice.text for choice in expected])
        assert streams.tokens() == [choice.logprobs.tokens for choice in expected]
        assert all(len(tokens) == MAX_TOKENS for tokens in streams.tokens())
        assert c.coordinator.metrics.migrations.labels(model_name)._value.get() >= 1
    finally:
        c.stop()


def test_a_drain_that_aborts_requests_moves_them(two_realtime_workers, undisturbed, model_name, tiny_ckpt):
    draining, other = two_realtime_workers
    c = InProcessCoordinator(workers=[w.address for w in two_realtime_workers],
                             model_dir=str(tiny_ckpt))
    try:
        streams = Streams(c.base_url, model_name)
        wait_until(lambda: streams.all_started(min_chunks=10), timeout=20)
        assert draining.status().load.running > 0

        draining.proc.terminate()          # drain, cut short after 0.2 s: its streams end with "abort"
        streams.join()

        check_all_continued(streams, undisturbed)
        assert c.coordinator.metrics.migrations.labels(model_name)._value.get() >= 1
        assert draining.proc.wait(timeout=10) == 0
    finally:
        c.stop()
