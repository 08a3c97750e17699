"""Serving benchmark for an OpenAI-compatible endpoint (MindMotor's coordinator, or any other).

Sends `--num-prompts` streaming requests at `--request-rate` (Poisson arrivals; `inf` sends them all
at once), at most `--max-concurrency` in flight, and measures from the client's side:

- TTFT: request sent -> first chunk that carries non-empty text;
- ITL: the gaps between successive text chunks (a chunk may carry several tokens);
- TPOT: (E2E - TTFT) / (output tokens - 1), output tokens from the usage chunk
  (`stream_options.include_usage`);
- E2E latency: request sent -> end of the stream.

It prints a summary table and ends with ONE JSON object on the last line of stdout. Errors (HTTP
429/503/..., broken streams, timeouts) are counted and reported, never fatal.

    python loadtest/bench_serving.py --base-url http://127.0.0.1:8000 --num-prompts 200 \\
        --request-rate 4 --input-len 256 --output-len 64 --goodput ttft:500 tpot:50

    python loadtest/bench_serving.py --base-url http://127.0.0.1:8000 --dataset azure-trace \\
        --trace-length-scale 0.25 --trace-time-scale 4 --num-prompts 100 --plot out.png

Workload lengths: fixed (`--input-len`, `--output-len`), uniform ranges around them
(`--input-len-range-ratio R`: [L(1-R), L(1+R)]), or `--dataset azure-trace`: (prompt, output)
lengths of rows of the Azure LLM inference trace 2023, conversation part (file
`services/mindmotor/assets/data/azure_llm_conv_2023.csv` (shipped in the package); Azure/AzurePublicDataset
`AzureLLMInferenceTrace_conv` as processed in microsoft/vidur; CC-BY; Patel et al., "Splitwise:
Efficient Generative LLM Inference Using Phase Splitting", ISCA 2024). With `--trace-time-scale S`
a contiguous window of the trace is replayed with its own arrival times multiplied by S (S < 1
is faster than the original), instead of the Poisson process.

Prompts are synthetic text. With `--tokenizer DIR` (a Hugging Face `tokenizer.json` directory)
each prompt is made to encode to exactly the asked number of tokens; without it the text has
about one word per asked token and the real count is taken from the server's usage figures.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
TRACE_PATH = REPO_ROOT / "services" / "mindmotor" / "assets" / "data" / "azure_llm_conv_2023.csv"
TRACE_CITATION = ("Azure LLM inference trace 2023, conversation part (Azure/AzurePublicDataset "
                  "AzureLLMInferenceTrace_conv, as processed in microsoft/vidur); CC-BY; Patel et al., "
                  "\"Splitwise: Efficient Generative LLM Inference Using Phase Splitting\", ISCA 2024")
ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
SLO_KEYS = ("ttft", "tpot", "e2el")

# Words for prompts composed without a tokenizer (common words: about one BPE token each in large
# vocabularies, a few in small ones; the server's usage figures give the real count).
WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which "
         "but have an they you were her she there been one all we their has would when what will more "
         "if no out so said can who about time up some into them could only other then its now over "
         "new also after first two way well any these may should people like between very many each "
         "much where through most before must back years under still just since great world house "
         "water light small large place right point system number group order part city state line "
         "river power field model value table music story early common").split()


# ---- server-sent events ------------------------------------------------------------------------
class SSEParser:
    """Incremental server-sent-events parser: `feed(bytes)` returns the `data` of every event that
    the bytes complete (multi-line data joined with "\\n"); comments and other fields are ignored.
    Lines end with LF or CRLF; an event ends with an empty line. `close()` returns a last event
    that was not followed by an empty line."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buf += chunk
        events: list[str] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                return events
            line, self._buf = self._buf[:nl], self._buf[nl + 1:]
            if line.endswith(b"\r"):
                line = line[:-1]
            self._line(line.decode("utf-8", errors="replace"), events)

    def close(self) -> list[str]:
        events: list[str] = []
        if self._buf:
            line, self._buf = self._buf.rstrip(b"\r"), b""
            self._line(line.decode("utf-8", errors="replace"), events)
        if self._data:
            events.append("\n".join(self._data))
            self._data = []
        return events

    def _line(self, line: str, events: list[str]) -> None:
        if not line:
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)


def chunk_text(obj: dict, chat: bool) -> str:
    """The text a completions / chat stream chunk adds (choice 0)."""
    choices = obj.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if chat:
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


def chunk_carries_tokens(obj: dict, chat: bool) -> bool:
    """Whether a stream chunk delivers generated tokens (choice 0): text, or tokens whose text the
    server still holds back (part of a UTF-8 character, a possible stop string). Only requests that
    ask for logprobs get a chunk for such tokens; without them, TTFT and ITL count text, as vLLM's
    serving benchmark does — with a model that opens with incomplete characters that can be many
    tokens late (`--logprobs 0` measures tokens)."""
    if chunk_text(obj, chat):
        return True
    choices = obj.get("choices") or []
    logprobs = (choices[0].get("logprobs") or {}) if choices else {}
    return bool(logprobs.get("content") if chat else logprobs.get("tokens"))


# ---- the workload ------------------------------------------------------------------------------
@dataclass
class RequestSpec:
    prompt: str
    prompt_len: int            # tokens asked (exact with --tokenizer, else approximate)
    output_len: int            # max_tokens
    arrival_s: float = 0.0     # offset from the start of the run


def load_trace(path: Path | str = TRACE_PATH) -> np.ndarray:
    """[rows, 3]: arrived_at (s), prompt tokens, output tokens."""
    with open(path, newline="") as f:
        rows = [(float(r["arrived_at"]), int(r["num_prefill_tokens"]), int(r["num_decode_tokens"]))
                for r in csv.DictReader(f)]
    return np.asarray(rows, dtype=np.float64)


def uniform_lengths(rng: np.random.Generator, n: int, length: int, ratio: float) -> list[int]:
    if not 0 <= ratio < 1:
        raise ValueError(f"a range ratio must be in [0, 1), got {ratio}")
    low, high = max(1, int(round(length * (1 - ratio)))), max(1, int(round(length * (1 + ratio))))
    return rng.integers(low, high + 1, size=n).tolist()


def poisson_offsets(rng: np.random.Generator, n: int, rate: float, burstiness: float = 1.0) -> list[float]:
    """Arrival offsets of n requests; gaps Gamma(burstiness, 1/(rate*burstiness)) (Poisson for 1);
    all zero for an infinite rate. The first request arrives at 0."""
    if math.isinf(rate) or n == 0:
        return [0.0] * n
    gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps).tolist()


def trace_workload(rng: np.random.Generator, n: int, *, length_scale: float, max_input: int,
                   max_output: int, time_scale: float | None, path: Path | str = TRACE_PATH
                   ) -> list[tuple[int, int, float | None]]:
    """(prompt len, output len, arrival offset or None) for n requests from the trace. Lengths are
    multiplied by `length_scale`, then clipped to [1, max_*]. With `time_scale` a contiguous window
    (random start) keeps the trace's order and arrival times (x time_scale); else rows are drawn
    with replacement and the arrivals are left to the caller."""
    rows = load_trace(path)
    if time_scale is not None:
        if n > len(rows):
            raise ValueError(f"the trace has {len(rows)} rows, fewer than --num-prompts {n}")
        start = int(rng.integers(0, len(rows) - n + 1))
        window = rows[start:start + n]
        arrivals = ((window[:, 0] - window[0, 0]) * time_scale).tolist()
    else:
        window = rows[rng.integers(0, len(rows), size=n)]
        arrivals = [None] * n
    out = []
    for (_, p, o), t in zip(window, arrivals):
        p = int(min(max(round(p * length_scale), 1), max_input))
        o = int(min(max(round(o * length_scale), 1), max_output))
        out.append((p, o, t))
    return out


class PromptMaker:
    """Synthetic prompts: random words; exact token counts when a tokenizer is given."""

    def __init__(self, rng: np.random.Generator, tokenizer_dir: str | None = None):
        self.rng = rng
        self.tok = None
        if tokenizer_dir:
            from tokenizers import Tokenizer
            self.tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))

    def _words(self, n: int) -> str:
        return " ".join(WORDS[i] for i in self.rng.integers(0, len(WORDS), size=n))

    def make(self, num_tokens: int) -> str:
        if self.tok is None:
            return self._words(num_tokens)
        text = self._words(num_tokens)
        for _ in range(8):       # trim or extend until it encodes to exactly num_tokens
            ids = self.tok.encode(text, add_special_tokens=False).ids
            if len(ids) == num_tokens:
                return text
            if len(ids) > num_tokens:
                text = self.tok.decode(ids[:num_tokens])
            else:
                text = text + " " + self._words(num_tokens - len(ids))
        return text              # closest found; the usage figures say what it really was

    def count(self, text: str) -> int | None:
        return None if self.tok is None else len(self.tok.encode(text, add_special_tokens=False).ids)


def build_workload(args: argparse.Namespace) -> list[RequestSpec]:
    rng = np.random.default_rng(args.seed)
    n = args.num_prompts
    if args.dataset == "azure-trace":
        rows = trace_workload(rng, n, length_scale=args.trace_length_scale, max_input=args.trace_max_input,
                              max_output=args.trace_max_output, time_scale=args.trace_time_scale,
                              path=args.trace_path)
        inputs, outputs = [r[0] for r in rows], [r[1] for r in rows]
        arrivals = ([r[2] for r in rows] if args.trace_time_scale is not None
                    else poisson_offsets(rng, n, args.request_rate, args.burstiness))
    else:
        inputs = uniform_lengths(rng, n, args.input_len, args.input_len_range_ratio)
        outputs = uniform_lengths(rng, n, args.output_len, args.output_len_range_ratio)
        arrivals = poisson_offsets(rng, n, args.request_rate, args.burstiness)
    maker = PromptMaker(rng, args.tokenizer)
    specs = []
    for p, o, t in zip(inputs, outputs, arrivals):
        text = maker.make(p)
        counted = maker.count(text)
        specs.append(RequestSpec(text, counted if counted is not None else p, o, float(t)))
    return specs


# ---- one request -------------------------------------------------------------------------------
@dataclass
class RequestResult:
    success: bool = False
    error: str = ""                  # "" | "http_429" | "http_503" | "ReadTimeout" | "stream_error" | ...
    detail: str = ""
    prompt_len: int = 0              # asked
    output_len: int = 0              # asked (max_tokens)
    prompt_tokens: int | None = None       # from usage
    output_tokens: int | None = None       # from usage (else the number of text chunks)
    send_s: float = 0.0              # offsets from the start of the run
    ttft_s: float | None = None
    e2el_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    chunk_s: list[float] = field(default_factory=list)    # text chunk times (offsets from the start)

    @property
    def tpot_s(self) -> float | None:
        if not self.success or self.output_tokens is None or self.output_tokens < 2 or self.ttft_s is None:
            return None
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)


def request_body(spec: RequestSpec, args: argparse.Namespace, model: str) -> dict:
    body: dict[str, Any] = {"model": model, "max_tokens": spec.output_len, "stream": True,
                            "stream_options": {"include_usage": True}, "temperature": args.temperature}
    if args.ignore_eos:
        body["ignore_eos"] = True
    chat = args.endpoint.endswith("/chat/completions")
    if args.logprobs is not None:      # every token in a chunk: TTFT/ITL of tokens, not of text
        body.update({"logprobs": True, "top_logprobs": args.logprobs} if chat else {"logprobs": args.logprobs})
    if chat:
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    return body


async def send_request(client, url: str, headers: dict, body: dict, chat: bool, t0: float,
                       result: RequestResult) -> RequestResult:
    """Stream one request, filling `result`; never raises (except cancellation)."""
    import httpx

    parser = SSEParser()
    usage = None
    chunks = 0
    start = time.perf_counter()
    result.send_s = start - t0
    last = None
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", errors="replace")
                result.error, result.detail = f"http_{resp.status_code}", text[:300]
                return result
            done = False
            async for raw in resp.aiter_raw():
                for data in parser.feed(raw):
                    now = time.perf_counter()
                    if data.strip() == "[DONE]":
                        done = True
                        continue
                    try:
                        obj = json.loads(data)
                    except json.JSONDecodeError:
                        result.error, result.detail = "bad_chunk", data[:300]
                        return result
                    if "error" in obj and "choices" not in obj:
                        result.error, result.detail = "stream_error", json.dumps(obj["error"])[:300]
                        return result
                    if obj.get("usage"):
                        usage = obj["usage"]
                    if chunk_carries_tokens(obj, chat):
                        chunks += 1
                        if last is None:
                            result.ttft_s = now - start
                        else:
                            result.itl_s.append(now - last)
                        last = now
                        result.chunk_s.append(now - t0)
            parser.close()
            if not done:
                result.error = "stream_incomplete"
                return result
        result.e2el_s = time.perf_counter() - start
    except httpx.HTTPError as exc:
        result.error, result.detail = type(exc).__name__, str(exc)[:300]
        return result
    except OSError as exc:
        result.error, result.detail = type(exc).__name__, str(exc)[:300]
        return result
    if usage:
        result.prompt_tokens = usage.get("prompt_tokens")
        result.output_tokens = usage.get("completion_tokens")
    else:
        result.output_tokens = chunks
    if result.ttft_s is None:        # no text at all (e.g. max_tokens of only special tokens)
        result.ttft_s = result.e2el_s
    result.success = True
    return result


# ---- statistics --------------------------------------------------------------------------------
def distribution(values_s: Iterable[float], percentiles: Iterable[float]) -> dict:
    """mean, std and percentiles (p50, p90, ...) in ms; None values when there are none."""
    arr = np.asarray(list(values_s), dtype=np.float64) * 1000.0
    out: dict[str, float | None] = {}
    if arr.size == 0:
        out["mean"] = out["std"] = None
        for p in percentiles:
            out[f"p{p:g}"] = None
        return out
    out["mean"] = float(arr.mean())
    out["std"] = float(arr.std())
    for p in percentiles:
        out[f"p{p:g}"] = float(np.percentile(arr, p))
    return out


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """["ttft:500", "tpot:50"] -> {"ttft": 0.5, "tpot": 0.05} (seconds)."""
    slos: dict[str, float] = {}
    for item in items or []:
        key, sep, value = item.partition(":")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"--goodput takes KEY:MS with KEY in {SLO_KEYS}, got {item!r}")
        ms = float(value)
        if ms <= 0:
            raise ValueError(f"an SLO must be positive, got {item!r}")
        slos[key] = ms / 1000.0
    return slos


def meets_slos(r: RequestResult, slos: dict[str, float]) -> bool:
    if not r.success:
        return False
    values = {"ttft": r.ttft_s, "tpot": r.tpot_s if r.tpot_s is not None else 0.0, "e2el": r.e2el_s}
    return all(values[k] is not None and values[k] <= limit for k, limit in slos.items())


def throughput_timeline(results: list[RequestResult], duration_s: float, bin_s: float = 1.0) -> dict:
    """Output tokens and finished requests per second in `bin_s` bins (each request's tokens spread
    evenly over its text chunks)."""
    nbins = max(1, int(math.ceil(duration_s / bin_s)))
    tokens = np.zeros(nbins)
    finished = np.zeros(nbins)
    for r in results:
        if not r.success:
            continue
        if r.chunk_s and r.output_tokens:
            per_chunk = r.output_tokens / len(r.chunk_s)
            for t in r.chunk_s:
                tokens[min(int(t / bin_s), nbins - 1)] += per_chunk
        finished[min(int((r.send_s + r.e2el_s) / bin_s), nbins - 1)] += 1
    return {"bin_s": bin_s, "output_tokens_per_s": (tokens / bin_s).round(2).tolist(),
            "requests_per_s": (finished / bin_s).round(2).tolist()}


def compute_metrics(results: list[RequestResult], duration_s: float, percentiles: Iterable[float] = (50, 90, 99),
                    slos: dict[str, float] | None = None) -> dict:
    percentiles = list(percentiles)
    ok = [r for r in results if r.success]
    errors: dict[str, int] = {}
    for r in results:
        if not r.success:
            errors[r.error or "unknown"] = errors.get(r.error or "unknown", 0) + 1
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_tokens if r.prompt_tokens is not None else r.prompt_len for r in ok)
    duration_s = max(duration_s, 1e-9)
    asked = [r for r in ok if r.output_tokens is not None]
    m: dict[str, Any] = {
        "num_prompts": len(results), "completed": len(ok), "failed": len(results) - len(ok), "errors": errors,
        "duration_s": duration_s, "total_input_tokens": int(in_tokens), "total_output_tokens": int(out_tokens),
        "request_throughput": len(ok) / duration_s, "output_throughput": out_tokens / duration_s,
        "total_token_throughput": (in_tokens + out_tokens) / duration_s,
        "output_tokens_as_asked": sum(1 for r in asked if r.output_tokens == r.output_len),
        "ttft_ms": distribution([r.ttft_s for r in ok], percentiles),
        "tpot_ms": distribution([r.tpot_s for r in ok if r.tpot_s is not None], percentiles),
        "itl_ms": distribution([x for r in ok for x in r.itl_s], percentiles),
        "e2el_ms": distribution([r.e2el_s for r in ok], percentiles),
    }
    if slos:
        good = sum(1 for r in results if meets_slos(r, slos))
        m["goodput"] = {"slos_ms": {k: v * 1000 for k, v in slos.items()}, "good_requests": good,
                        "request_goodput": good / duration_s, "fraction": good / max(1, len(results))}
    return m


# ---- the run -----------------------------------------------------------------------------------
def _progress(total: int, disable: bool):
    if disable:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="requests", file=sys.stderr, unit="req")


async def resolve_model(client, base_url: str, headers: dict) -> str:
    resp = await client.get(base_url + "/v1/models", headers=headers)
    resp.raise_for_status()
    data = resp.json().get("data") or []
    if not data:
        raise RuntimeError("the server lists no models; pass --model")
    return data[0]["id"]


async def run_benchmark(args: argparse.Namespace, specs: list[RequestSpec] | None = None) -> dict:
    """The benchmark: returns the result dict (metrics + config + per-request details)."""
    import httpx

    specs = specs if specs is not None else build_workload(args)
    base = args.base_url.rstrip("/")
    url = base + args.endpoint
    chat = args.endpoint.endswith("/chat/completions")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    slos = parse_goodput(args.goodput)
    limit = args.max_concurrency or len(specs) or 1
    limits = httpx.Limits(max_connections=min(limit, 1000), max_keepalive_connections=min(limit, 1000))
    timeout = httpx.Timeout(args.request_timeout, connect=min(30.0, args.request_timeout))
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        model = args.model or await resolve_model(client, base, headers)
        for i in range(args.warmup_requests):      # not counted: checks the endpoint, warms the path
            w = RequestSpec(specs[i % len(specs)].prompt[:200], 0, min(4, specs[i % len(specs)].output_len))
            res = await send_request(client, url, headers, request_body(w, args, model), chat, time.perf_counter(),
                                     RequestResult())
            if not res.success:
                print(f"warmup request failed: {res.error} {res.detail}", file=sys.stderr)

        sem = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
        results = [RequestResult(prompt_len=s.prompt_len, output_len=s.output_len) for s in specs]
        bar = _progress(len(specs), args.disable_tqdm)
        in_flight = 0
        peak = 0

        async def one(i: int, spec: RequestSpec) -> None:
            nonlocal in_flight, peak
            if sem is not None:
                await sem.acquire()
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                await send_request(client, url, headers, request_body(spec, args, model), chat, t0, results[i])
            finally:
                in_flight -= 1
                if sem is not None:
                    sem.release()
                if bar is not None:
                    bar.update(1)

        t0 = time.perf_counter()
        tasks = []
        for i, spec in enumerate(specs):
            delay = t0 + spec.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, spec)))
        deadline = None if args.max_duration is None else max(0.0, t0 + args.max_duration - time.perf_counter())
        done, pending = await asyncio.wait(tasks, timeout=deadline) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        duration = time.perf_counter() - t0
        for r in results:
            if not r.success and not r.error:
                r.error = "cancelled_at_max_duration"
        if bar is not None:
            bar.close()

    metrics = compute_metrics(results, duration, args.percentiles, slos)
    metrics["max_concurrency_observed"] = peak
    metrics["timeline"] = throughput_timeline(results, duration)
    if args.dataset == "azure-trace" and args.trace_time_scale is not None:
        rate: float | str = "trace-replay"
    else:             # strict JSON has no Infinity
        rate = "inf" if math.isinf(args.request_rate) else args.request_rate
    config = {"base_url": base, "endpoint": args.endpoint, "model": model, "num_prompts": len(specs),
              "request_rate": rate, "burstiness": args.burstiness,
              "max_concurrency": args.max_concurrency, "dataset": args.dataset, "seed": args.seed,
              "ignore_eos": args.ignore_eos, "temperature": args.temperature, "logprobs": args.logprobs,
              "tokenizer": args.tokenizer,
              "input_len_mean": float(np.mean([s.prompt_len for s in specs])) if specs else 0.0,
              "output_len_mean": float(np.mean([s.output_len for s in specs])) if specs else 0.0}
    if args.dataset == "azure-trace":
        config.update(trace=str(args.trace_path), trace_citation=TRACE_CITATION,
                      trace_length_scale=args.trace_length_scale, trace_time_scale=args.trace_time_scale,
                      trace_max_input=args.trace_max_input, trace_max_output=args.trace_max_output)
    else:
        config.update(input_len=args.input_len, output_len=args.output_len,
                      input_len_range_ratio=args.input_len_range_ratio,
                      output_len_range_ratio=args.output_len_range_ratio)
    return {"config": config, "metrics": metrics, "requests": [asdict(r) for r in results]}


# ---- output ------------------------------------------------------------------------------------
def summary_table(result: dict) -> str:
    m, c = result["metrics"], result["config"]
    lines = ["=" * 60, f"{'Serving benchmark':^60}", "=" * 60]

    def row(name: str, value) -> None:
        if isinstance(value, float):
            value = f"{value:.2f}"
        lines.append(f"{name:<44}{value!s:>16}")

    row("Endpoint", c["endpoint"])
    row("Model", c["model"])
    row("Request rate (req/s)", c["request_rate"])
    row("Max concurrency", c["max_concurrency"] or "-")
    row("Successful requests", m["completed"])
    row("Failed requests", m["failed"])
    for kind, count in sorted(m["errors"].items()):
        row(f"  {kind}", count)
    row("Benchmark duration (s)", m["duration_s"])
    row("Total input tokens", m["total_input_tokens"])
    row("Total output tokens", m["total_output_tokens"])
    row("Request throughput (req/s)", m["request_throughput"])
    row("Output token throughput (tok/s)", m["output_throughput"])
    row("Total token throughput (tok/s)", m["total_token_throughput"])
    if "goodput" in m:
        row("Request goodput (req/s)", m["goodput"]["request_goodput"])
        row("Requests within SLOs", f"{m['goodput']['good_requests']}/{m['num_prompts']}")
    for key, title in (("ttft_ms", "Time to first token"), ("tpot_ms", "Time per output token"),
                       ("itl_ms", "Inter-chunk latency"), ("e2el_ms", "End-to-end latency")):
        lines.append(f"{'-' * 14}{title:^32}{'-' * 14}")
        for stat, value in m[key].items():
            if stat != "std":
                row(f"{'Mean' if stat == 'mean' else stat.upper()} {key.split('_')[0].upper()} (ms)",
                    "-" if value is None else float(value))
    lines.append("=" * 60)
    return "\n".join(lines)


def headline(result: dict) -> dict:
    """The JSON object printed on the last stdout line (no per-request details)."""
    m = dict(result["metrics"])
    m.pop("timeline", None)
    return {"benchmark": "bench_serving", **result["config"], **m}


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reqs = [r for r in result["requests"] if r["success"]]
    ttft = [r["ttft_s"] * 1000 for r in reqs]
    e2e = [r["e2el_s"] * 1000 for r in reqs]
    tpot = [(r["e2el_s"] - r["ttft_s"]) * 1000 / (r["output_tokens"] - 1) for r in reqs
            if r["output_tokens"] and r["output_tokens"] > 1]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, values, title in ((axes[0][0], ttft, "TTFT (ms)"), (axes[0][1], tpot, "TPOT (ms)"),
                              (axes[1][0], e2e, "E2E latency (ms)")):
        if values:
            ax.hist(values, bins=min(50, max(5, len(values) // 4)), color="tab:blue", alpha=0.8)
            for p, style in ((50, "--"), (99, ":")):
                ax.axvline(np.percentile(values, p), color="k", linestyle=style, label=f"p{p}")
            ax.legend()
        ax.set_title(title)
        ax.set_ylabel("requests")
    tl = result["metrics"]["timeline"]
    xs = np.arange(len(tl["output_tokens_per_s"])) * tl["bin_s"]
    ax = axes[1][1]
    ax.plot(xs, tl["output_tokens_per_s"], label="output tok/s", color="tab:green")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("output tokens/s")
    ax2 = ax.twinx()
    ax2.plot(xs, tl["requests_per_s"], label="finished req/s", color="tab:orange")
    ax2.set_ylabel("finished requests/s")
    ax.set_title("throughput over time")
    c = result["config"]
    fig.suptitle(f"{c['model']} {c['endpoint']} rate={c['request_rate']} n={c['num_prompts']} "
                 f"({c['dataset']})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- command line ------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", default="/v1/completions", choices=ENDPOINTS)
    p.add_argument("--model", default=None, help="served model id (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second, Poisson arrivals (default: inf = all at once)")
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the inter-arrival times (1 = Poisson; < 1 burstier)")
    p.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    p.add_argument("--dataset", default="random", choices=("random", "azure-trace"))
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--input-len-range-ratio", type=float, default=0.0,
                   help="prompt lengths uniform in [L(1-R), L(1+R)]")
    p.add_argument("--output-len-range-ratio", type=float, default=0.0)
    p.add_argument("--trace-path", default=str(TRACE_PATH))
    p.add_argument("--trace-length-scale", type=float, default=1.0,
                   help="multiply the trace's prompt and output lengths (e.g. 0.25 for a slow host)")
    p.add_argument("--trace-max-input", type=int, default=3072, help="clip prompt lengths (after scaling)")
    p.add_argument("--trace-max-output", type=int, default=1024, help="clip output lengths (after scaling)")
    p.add_argument("--trace-time-scale", type=float, default=None,
                   help="replay the trace's arrival times multiplied by this (instead of --request-rate)")
    p.add_argument("--tokenizer", default=None, help="directory with tokenizer.json: exact prompt lengths")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="generate exactly max_tokens (default: on)")
    p.add_argument("--logprobs", type=int, default=None, metavar="K",
                   help="ask for K top logprobs per token, so that every token arrives in a chunk: TTFT and "
                        "ITL then count tokens, also those whose text is held back (default: off, text)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--percentiles", type=lambda s: [float(x) for x in s.split(",")], default=[50, 90, 99],
                   help="comma list (default: 50,90,99)")
    p.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                   help="SLOs for goodput, e.g. ttft:500 tpot:50 e2el:5000")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--max-duration", type=float, default=None,
                   help="cancel what is still running after this many seconds (counted as errors)")
    p.add_argument("--warmup-requests", type=int, default=1, help="short requests before the run (not counted)")
    p.add_argument("--save-result", default=None, metavar="FILE.json", help="result with per-request details")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="TTFT/TPOT/E2E histograms, throughput over time")
    p.add_argument("--disable-tqdm", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        parse_goodput(args.goodput)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"building {args.num_prompts} prompts ({args.dataset})...", file=sys.stderr, flush=True)
    try:
        result = asyncio.run(run_benchmark(args))
    except Exception as exc:  # noqa: BLE001 - e.g. the server is not there: one JSON line, exit 1
        print(json.dumps({"benchmark": "bench_serving", "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    if args.save_result:
        Path(args.save_result).parent.mkdir(parents=True, exist_ok=True)
        Path(args.save_result).write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot(result, args.plot)
    print(summary_table(result))
    print(json.dumps(headline(result), allow_nan=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
