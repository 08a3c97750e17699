"""A streamed request that legitimately waits on a real worker — queued behind another one for
several progress deadlines — is not given up while the worker's keepalives flow; a worker that
sends none (`--stream-keepalive 0`) looks frozen to the same coordinator, and the request is given
up. (A non-streamed request is one unary call, which carries no keepalives: the progress guard
watches it for the routing table's word only — the first request below is one.)"""

from __future__ import annotations

import json
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

        def complete(name: str, max_tokens: int, stream: bool = False) -> None:
            answers[name] = httpx.post(f"{c.url}/v1/completions", timeout=60, json={
                "model": model_name, "prompt": f"the {name} one", "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})})

        first = threading.Thread(target=complete, args=("first", LONG_TOKENS))
        first.start()
        wait_until(lambda: worker.status().load.running == 1, timeout=20)   # the only sequence slot taken
        complete("queued", 4, stream=True)     # a stream: its first piece is awaited before the answer starts
        first.join(60)

        assert answers["first"].status_code == 200
        assert answers["first"].json()["usage"]["completion_tokens"] == LONG_TOKENS
        assert answers["queued"].status_code == queued_outcome, answers["queued"].text
        stalls = c.coordinator.metrics.stream_stalls.labels(model_name, "deadline")._value.get()
        if queued_outcome == 200:
            usage = [json.loads(line[6:])["usage"] for line in answers["queued"].text.splitlines()
                     if line.startswith("data: {") and json.loads(line[6:]).get("usage")]
            assert usage[-1]["completion_tokens"] == 4
            assert stalls == 0
        else:
            assert stalls >= 1         # silent for the deadline: given up, the only instance marked
    finally:
        c.stop()
        worker.stop()
