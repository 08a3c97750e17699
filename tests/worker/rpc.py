"""Building requests and reading streams in tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from mindmotor.protocol import worker_pb2 as pb


def request(prompt: str | list[int], request_id: str = "", **sampling) -> pb.GenerateRequest:
    """A GenerateRequest; `sampling` are SamplingParams fields (greedy unless temperature given)."""
    sampling.setdefault("temperature", 0.0)
    req = pb.GenerateRequest(request_id=request_id, sampling=pb.SamplingParams(**sampling))
    if isinstance(prompt, str):
        req.prompt_text = prompt
    else:
        req.prompt_token_ids.ids.extend(prompt)
    return req


@dataclass
class Collected:
    request_ids: set[str] = field(default_factory=set)
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list = field(default_factory=list)
    chunks: int = 0
    last: pb.GenerateResponse | None = None

    @property
    def finish_reason(self) -> str:
        return self.last.finish_reason if self.last else ""


def collect(stream) -> Collected:
    """Read a Generate stream to its end."""
    out = Collected()
    for chunk in stream:
        out.request_ids.add(chunk.request_id)
        out.token_ids += chunk.token_ids
        out.text += chunk.text
        out.logprobs += chunk.logprobs
        out.chunks += 1
        out.last = chunk
    return out
