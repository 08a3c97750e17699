"""Locust load test for an OpenAI-compatible endpoint (MindMotor's coordinator).

Each simulated user mixes four requests: streaming and non-streaming `/v1/completions` and
`/v1/chat/completions`. Besides Locust's own request statistics it records, per request type:

- `TTFT <name>` entries (request_type "TTFT"): time to the first chunk with text, and `E2E <name>`
  entries: time to the end of the stream (streaming only; Locust's own POST row for a stream is
  the time to the response headers, which the coordinator sends with the first piece);
- the response "size" of every generation request is its number of output tokens (from `usage`),
  so Locust's "Average size" column reads as *tokens per request*;
- at the end, a summary on stderr: requests, output tokens, tokens per request and tokens per
  second over the run.

A 429/503 is a failure in Locust's table (with the status), never an exception.

Headless, bounded (20 users, 5 started per second, 30 s), against a local platform:

    .venv/bin/locust -f loadtest/locustfile.py --headless -u 20 -r 5 -t 30s \\
        --host http://127.0.0.1:8000 [--model NAME] [--max-tokens 32] [--prompt-words 64] [--api-key K]

`--model` defaults to the first model of `GET /v1/models`.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time

from locust import HttpUser, between, events, task

WORDS = ("the of and to in is that for it as was with be by on not this are or from at which have an "
         "they you were there one all we can more if no out so time up some into only other then now "
         "new also first two way well any these may people like very many each much where most").split()


@events.init_command_line_parser.add_listener
def _add_arguments(parser):
    parser.add_argument("--model", default="", help="served model id (default: the first of /v1/models)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens per request (ignore_eos on)")
    parser.add_argument("--prompt-words", type=int, default=64, help="words in each synthetic prompt")
    parser.add_argument("--api-key", default="", help="sent as a Bearer token")


class _Totals:
    """Output tokens over the whole run (all users, all greenlets)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.tokens = 0
        self.started = time.time()

    def add(self, tokens: int) -> None:
        with self.lock:
            self.requests += 1
            self.tokens += tokens


TOTALS = _Totals()
_MODEL: dict[str, str] = {}


@events.test_start.add_listener
def _on_start(environment, **_kw):
    TOTALS.started = time.time()


@events.test_stop.add_listener
def _on_stop(environment, **_kw):
    elapsed = max(1e-9, time.time() - TOTALS.started)
    per_req = TOTALS.tokens / TOTALS.requests if TOTALS.requests else 0.0
    summary = {"generation_requests_ok": TOTALS.requests, "output_tokens": TOTALS.tokens,
               "tokens_per_request": round(per_req, 2), "output_tokens_per_s": round(TOTALS.tokens / elapsed, 2),
               "elapsed_s": round(elapsed, 2)}
    print("mindmotor locust summary: " + json.dumps(summary), file=sys.stderr, flush=True)


class OpenAIUser(HttpUser):
    wait_time = between(0.05, 0.3)

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        self.max_tokens = getattr(opts, "max_tokens", 32) if opts else 32
        self.prompt_words = getattr(opts, "prompt_words", 64) if opts else 64
        key = getattr(opts, "api_key", "") if opts else ""
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.model = (getattr(opts, "model", "") if opts else "") or _MODEL.get("id", "")
        if not self.model:
            with self.client.get("/v1/models", headers=self.headers, name="/v1/models",
                                 catch_response=True) as resp:
                if resp.status_code == 200 and resp.json().get("data"):
                    self.model = _MODEL["id"] = resp.json()["data"][0]["id"]
                else:
                    resp.failure(f"cannot list models: {resp.status_code}")

    # ---- the request mix ----------------------------------------------------------------------
    def _prompt(self) -> str:
        return " ".join(random.choice(WORDS) for _ in range(self.prompt_words))

    def _body(self, chat: bool, stream: bool) -> dict:
        body = {"model": self.model, "max_tokens": self.max_tokens, "ignore_eos": True, "temperature": 0.0,
                "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if chat:
            body["messages"] = [{"role": "user", "content": self._prompt()}]
        else:
            body["prompt"] = self._prompt()
        return body

    @task(3)
    def completion_stream(self) -> None:
        self._stream("/v1/completions", chat=False, name="completions stream")

    @task(1)
    def completion(self) -> None:
        self._plain("/v1/completions", chat=False, name="completions")

    @task(3)
    def chat_stream(self) -> None:
        self._stream("/v1/chat/completions", chat=True, name="chat stream")

    @task(1)
    def chat(self) -> None:
        self._plain("/v1/chat/completions", chat=True, name="chat")

    # ---- helpers ------------------------------------------------------------------------------
    def _plain(self, path: str, chat: bool, name: str) -> None:
        with self.client.post(path, json=self._body(chat, stream=False), headers=self.headers, name=name,
                              catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {resp.text[:200]}")
                return
            tokens = int((resp.json().get("usage") or {}).get("completion_tokens", 0))
            resp.request_meta["response_length"] = tokens
            resp.success()
            TOTALS.add(tokens)

    def _stream(self, path: str, chat: bool, name: str) -> None:
        start = time.perf_counter()
        ttft = None
        tokens = 0
        done = False
        with self.client.post(path, json=self._body(chat, stream=True), headers=self.headers, name=name,
                              stream=True, catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {resp.text[:200]}")
                return
            try:
                for line in resp.iter_lines():
                    if not line or not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    obj = json.loads(data)
                    if "error" in obj and "choices" not in obj:
                        resp.failure(f"stream error: {json.dumps(obj['error'])[:200]}")
                        return
                    if obj.get("usage"):
                        tokens = int(obj["usage"].get("completion_tokens", 0))
                    choices = obj.get("choices") or []
                    if ttft is None and choices:
                        text = (choices[0].get("delta") or {}).get("content") if chat else choices[0].get("text")
                        if text:
                            ttft = time.perf_counter() - start
            except Exception as exc:  # noqa: BLE001 - a broken stream is a failure, not a crash
                resp.failure(f"{type(exc).__name__}: {exc}")
                return
            if not done:
                resp.failure("the stream ended without [DONE]")
                return
            resp.request_meta["response_length"] = tokens
            resp.success()
        e2e = time.perf_counter() - start
        TOTALS.add(tokens)
        if ttft is not None:
            events.request.fire(request_type="TTFT", name=name, response_time=ttft * 1000.0, response_length=0,
                                exception=None, context={})
        events.request.fire(request_type="E2E", name=name, response_time=e2e * 1000.0, response_length=tokens,
                            exception=None, context={})
