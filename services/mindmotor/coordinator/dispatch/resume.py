"""Resuming a stream on another coordinator: SSE `id:`s that say where the client stands, and a
`Last-Event-ID` turned back into generations that continue from there.

Every event of a resumable stream carries an id: `StreamMarks` — per choice, the instance and the
worker call (request id) producing it, the tokens and characters the client has been sent, and
whether its finish chunk went out; whether the usage chunk went out; the response's id, creation
time and a digest of the request — as compact JSON in base64url, then `.` and an HMAC-SHA256 of it
(16 bytes) under `resume_key`, a secret every coordinator of the platform shares (`mindmotor up`
makes one for its replicas). A client whose connection broke sends the same request again with
`Last-Event-ID: <the last id it received>`; whichever coordinator gets it checks the HMAC and that
the request is the same, asks each choice's worker for the output it has (`Worker.Recall`: kept
for `--resume-retention` after the call ended, also when the coordinator that made it died), takes
the tokens the client has as a continuation (`Generation.resume_from`: never generated again, the
seeded random stream and stop strings continue across the move) and streams only what follows.

Resumable: streams of completions and of chat completions without parsed tool calls (whose
several chunks per piece have no single position), with at most `MAX_CHOICES` choices.
Refusals: a malformed or forged id, or another request → 400 `invalid_last_event_id`; a worker
that no longer has the output (restarted, or past its retention) → 404 `stream_not_resumable`:
the client must start again.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
from dataclasses import dataclass, field

import grpc

from mindmotor.protocol import worker_pb2 as pb

from mindmotor.coordinator.http.errors import BadRequest, NotFound

log = logging.getLogger("mindmotor.coordinator")
RECALL_TIMEOUT_S = 5.0

MAX_CHOICES = 8
HEADER = "last-event-id"


class ResumeRefused(BadRequest):
    def __init__(self, message: str):
        super().__init__(message, param="Last-Event-ID", code="invalid_last_event_id")


class NotResumable(NotFound):
    type = "invalid_request_error"

    def __init__(self, message: str):
        super().__init__(message, param="Last-Event-ID", code="stream_not_resumable")


@dataclass
class ChoiceMark:
    """Where one choice stands for the client."""
    instance: str = ""           # the instance whose call produced its last piece
    call: str = ""               # that call's request id on the worker
    tokens: int = 0              # output tokens the client has
    chars: int = 0               # characters of text the client has
    finished: bool = False       # its finish chunk went out

    def to_list(self) -> list:
        return [self.instance, self.call, self.tokens, self.chars, int(self.finished)]

    @classmethod
    def from_list(cls, value) -> "ChoiceMark":
        instance, call, tokens, chars, finished = value
        if not (isinstance(instance, str) and isinstance(call, str) and isinstance(tokens, int)
                and isinstance(chars, int) and tokens >= 0 and chars >= 0):
            raise ValueError("bad choice mark")
        return cls(instance, call, tokens, chars, bool(finished))


@dataclass
class StreamMarks:
    response_id: str
    created: int
    digest: str                                  # hex: the request (request_fingerprint)
    choices: list[ChoiceMark] = field(default_factory=list)
    usage_sent: bool = False

    def encode(self, key: bytes) -> str:
        body = json.dumps([self.response_id, self.created, self.digest, [c.to_list() for c in self.choices],
                           int(self.usage_sent)], separators=(",", ":")).encode()
        payload = base64.urlsafe_b64encode(body).rstrip(b"=")
        return (payload + b"." + _sign(key, payload)).decode()

    @classmethod
    def decode(cls, key: bytes, text: str) -> "StreamMarks":
        """ResumeRefused for anything but an id this platform made."""
        payload, _, signature = text.strip().encode("ascii", "replace").partition(b".")
        if not payload or not hmac.compare_digest(signature, _sign(key, payload)):
            raise ResumeRefused("the Last-Event-ID is not one this platform sent (or its coordinators do "
                                "not share a resume key)")
        try:
            response_id, created, digest, choices, usage_sent = json.loads(
                base64.urlsafe_b64decode(payload + b"=" * (-len(payload) % 4)))
            return cls(str(response_id), int(created), str(digest), [ChoiceMark.from_list(c) for c in choices],
                       bool(usage_sent))
        except (ValueError, TypeError) as exc:
            raise ResumeRefused(f"the Last-Event-ID is malformed ({exc})") from None


def _sign(key: bytes, payload: bytes) -> bytes:
    return base64.urlsafe_b64encode(hmac.new(key, payload, hashlib.sha256).digest()[:16]).rstrip(b"=")


def new_key() -> bytes:
    return secrets.token_bytes(32)


def request_fingerprint(calls: list[bytes]) -> str:
    """The request's digest: those of its choices' worker calls (prompt and sampling), in order."""
    return hashlib.sha256(b"".join(calls)).hexdigest()[:24]


class StreamMarker:
    """A stream's marks kept up to date as its chunks go out: the id of each chunk."""

    def __init__(self, marks: StreamMarks, key: bytes, prompt_lengths: list[int], resumed: bool = False):
        self.marks = marks
        self.key = key
        self.prompt_lengths = prompt_lengths     # per choice
        self.resumed = resumed        # the stream continues one a client already began

    def on_piece(self, index: int, piece) -> None:
        mark = self.marks.choices[index]
        if piece.source[0]:
            mark.instance, mark.call = piece.source
        mark.tokens += len(piece.token_ids)
        mark.chars += len(piece.text)

    def chunk_id(self, index: int, chunk: dict) -> str:
        choices = chunk.get("choices") or ()
        if choices and choices[0].get("finish_reason") is not None:
            self.marks.choices[index].finished = True
        return self.marks.encode(self.key)

    def usage_id(self) -> str:
        self.marks.usage_sent = True
        return self.marks.encode(self.key)

    def finished_usages(self) -> list[tuple[int, "object"]]:
        """(choice index, Usage) of the choices the client saw finish before the stream was cut."""
        from mindmotor.coordinator.dispatch.generation import Usage

        return [(i, Usage(prompt_tokens=self.prompt_lengths[i], completion_tokens=mark.tokens))
                for i, mark in enumerate(self.marks.choices) if self.resumed and mark.finished]


async def stream_marker(header: str | None, generations: list, fmt, key: bytes, table, channels,
                        metrics) -> StreamMarker | None:
    """The marker of a new stream (no `header`), or of one resumed from the `Last-Event-ID`
    `header` — its choices' generations set to continue where the client stands (and `fmt` given
    the response's original id and creation time); None for a stream that cannot be resumed."""
    if not getattr(fmt, "resumable", False) or len(generations) > MAX_CHOICES:
        if header:
            raise ResumeRefused("this stream cannot be resumed (it has parsed tool calls, logprobs, or more than "
                                f"{MAX_CHOICES} choices); send the request again without Last-Event-ID")
        return None
    digest = request_fingerprint([g.digest for g in generations])
    lengths = [len(g.request.prompt_token_ids) for g in generations]
    if not header:
        return StreamMarker(StreamMarks(fmt.response_id, fmt.created, digest, [ChoiceMark() for _ in generations]),
                            key, lengths)
    try:
        marks = StreamMarks.decode(key, header)
        if marks.digest != digest or len(marks.choices) != len(generations):
            raise ResumeRefused("the Last-Event-ID belongs to another request: resume with the very request "
                                "the stream answered")
        for generation, mark in zip(generations, marks.choices):
            if not mark.finished and mark.call:
                await _continue(generation, mark, table, channels)
    except (ResumeRefused, NotResumable) as exc:
        metrics.stream_resumes.labels("invalid" if isinstance(exc, ResumeRefused) else "not_resumable").inc()
        raise
    metrics.stream_resumes.labels("resumed").inc()
    fmt.response_id, fmt.created = marks.response_id, marks.created
    if getattr(fmt, "running", None) is not None:        # continuous_usage_stats count on from the client's
        for index, mark in enumerate(marks.choices):
            fmt.running.add(index, mark.tokens)
    log.info("stream resumed", extra={"choices": [[m.instance, m.tokens, m.finished] for m in marks.choices]})
    return StreamMarker(marks, key, lengths, resumed=True)


async def _continue(generation, mark: ChoiceMark, table, channels) -> None:
    """Set `generation` to continue after what the client has of it, from its worker's Recall."""
    address = next((v.address for v in table.all() if v.instance_id == mark.instance), None)
    if address is None:
        raise NotResumable(f"instance {mark.instance} that served this stream is gone; start the request again")
    try:
        recalled = await channels.stub(address).Recall(pb.RecallRequest(request_id=mark.call),
                                                       timeout=RECALL_TIMEOUT_S)
    except grpc.aio.AioRpcError as exc:
        raise NotResumable(f"the output of this stream is no longer available ({exc.code().name}: "
                           f"{exc.details()}); start the request again") from None
    if recalled.digest != generation.digest:
        raise ResumeRefused("the Last-Event-ID belongs to another request: resume with the very request the "
                            "stream answered")
    tokens = list(recalled.output_token_ids)
    if len(tokens) < mark.tokens:
        raise NotResumable("the worker has less of this stream than its client: start the request again")
    kind = recalled.WhichOneof("stop_reason")
    finished = recalled.finish_reason if len(tokens) == mark.tokens else None
    generation.resume_from(tokens[:mark.tokens], mark.chars, finished or None,
                           getattr(recalled, kind) if kind else None)
