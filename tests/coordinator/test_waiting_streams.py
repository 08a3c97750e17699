"""A request that legitimately waits on a real worker — queued behind another one for several
progress deadlines — is not given up while the worker's keepalives flow; a worker that sends
none (`--stream-keepalive 0`) looks frozen to the same coordinator, and the request is given up."""

from __future__ import annotations

import threading

import httpx
import pytest

from .processes import REALTIME_ARGS, InProcessCoordinator, start_workers, wait_until

LONG_TOKENS = 160          # ~2.4 s at ~15 ms a step: the queued request waits ~3 deadlines
DEADLINE_S = 0.8           # 8 keepalive intervals


@pytest.mark.parametrize("keepalive, queued_outcome", [("0.1", 200), ("0", 503)])
def test_a_queued_request_is_not_given_up_while_keepalives_flow(tiny_ckpt, tmp_path, model_name, keepalive,
                                                                 queued_outcome):
    (worker,) = start_workers(tiny_ckpt, tmp_path, 1, *REALTIME_ARGS, "--max-num-seqs", "1",
                              "--stream-keepalive", keepalive)
    c = InProcessCoordinator(workers=[worker.address], model_dir=str(tiny_ckpt),
                             stream_progress_timeout_s=DEADLINE_S, stream_first_message_timeout_s=DEADLINE_S)
    try:
        answers: dict[str, httpx.Response] = {}

        def complete(name: str, max_tokens: int) -> None:
            answers[name] = httpx.post(f"{c.url}/v1/completions", timeout=60, json={
                "model": model_name, "prompt": f"the {name} one", "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True})

        first = threading.Thread(target=complete, args=("first", LONG_TOKENS))
        first.start()
        wait_until(lambda: worker.status().load.running == 1, timeout=20)   # the only sequence slot taken
        complete("queued", 4)
        first.join(60)

        assert answers["first"].status_code == 200
        assert answers["first"].json()["usage"]["completion_tokens"] == LONG_TOKENS
        assert answers["queued"].status_code == queued_outcome, answers["queued"].text
        stalls = c.coordinator.metrics.stream_stalls.labels(model_name, "deadline")._value.get()
        if queued_outcome == 200:
            assert answers["queued"].json()["usage"]["completion_tokens"] == 4
            assert stalls == 0
        else:
            assert stalls >= 1         # silent for the deadline: given up, the only instance marked
    finally:
        c.stop()
        worker.stop()
