"""From started generations to the HTTP response, the same for both generation endpoints:
a JSON body (all choices collected), or an SSE stream (chunks as they come, the usage chunk when
asked, `[DONE]`; an error after the stream began is sent as an `{"error": ...}` event). Either way
the worker calls stop and the admission ticket is given back when the response ends, or when the
client goes away.

Who served it: `request.state.instances` / `.versions` (comma-separated, in choice order, each
once) become the `X-MindMotor-Instance` / `X-MindMotor-Version` response headers and fields of the
access log line (`middleware.py`). A JSON body names the instances that finished each choice (after
a failover, the last one); a stream's headers go out once every choice has its first token (the
choices are routed before the response starts), so they name the instances that produced the first
tokens — a stream moved to another instance later is named in the access log line, not the headers.
The request is counted for the version of its first choice (`version_requests`, `version_errors`,
`version_ttft` per choice: what canary analysis judges; a LoRA adapter's requests under their base
model's label and under the adapter's name too). Only errors the version caused count as its errors
(`version_fault`): a 5xx, an instance failure, a 400 the instance gave a request the coordinator
accepted; a client's own 4xx (a bad parameter, a 429 `instances_busy`) and a client that went away
do not."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mindmotor.coordinator.dispatch.admission import Ticket
from mindmotor.coordinator.http.disconnect import until_disconnect
from mindmotor.coordinator.http.errors import APIError, ClientGone
from mindmotor.coordinator.dispatch.failures import RefusedByInstance
from mindmotor.coordinator.dispatch.fanout import ChoiceSet
from mindmotor.coordinator.dispatch.generation import Piece, Usage
from mindmotor.coordinator.metrics import CoordinatorMetrics
from mindmotor.coordinator.openai.results import ChoiceResult, total_usage
from mindmotor.coordinator.dispatch.resume import StreamMarker
from mindmotor.coordinator.http.sse import DONE, EventStreamResponse, event


class OutputFormat(Protocol):
    stream_end: bytes | None        # the stream's last event (OpenAI's `[DONE]`), if it has one

    def stream_start(self, index: int) -> list[dict]: ...
    def stream_piece(self, index: int, piece: Piece) -> list[dict]: ...
    def stream_error(self, exc: APIError) -> dict: ...
    def usage_chunk(self, usage: Usage) -> dict: ...
    def response(self, results: list[ChoiceResult], usage: Usage) -> dict: ...


class OpenAIFraming:
    """How an OpenAI stream reports an error after it began (the error body as an event) and ends
    (`data: [DONE]`)."""
    stream_end: bytes | None = DONE

    def stream_error(self, exc: APIError) -> dict:
        return exc.body()


async def respond(request: Request, choices: ChoiceSet, prompt_indices: list[int], fmt: OutputFormat,
                  stream: bool, include_usage: bool, ticket: Ticket, metrics: CoordinatorMetrics | None = None,
                  model: str = "", in_flight=None, marker: StreamMarker | None = None, lora: str | None = None) -> Response:
    served = ServedBy(request, choices, metrics, model, lora)
    counted = False                 # this stream is in `in_flight.streams`

    async def close() -> None:
        nonlocal counted
        if counted:
            counted = False
            in_flight.streams -= 1
        await choices.aclose()
        ticket.release()
        served.finish()

    async def whole() -> list[ChoiceResult]:
        await choices.start()
        served.started()
        return await _collect(choices, prompt_indices)

    try:
        if stream:
            await until_disconnect(request, choices.start())
            served.started()
        else:
            results = await until_disconnect(request, whole())
    except BaseException as exc:
        served.failed(exc)
        await close()
        raise
    if not stream:
        await close()
        usage = total_usage([(r.prompt_index, r.usage) for r in results])
        return JSONResponse(fmt.response(results, usage))
    if in_flight is not None:
        in_flight.streams += 1
        counted = True
    return EventStreamResponse(_events(choices, prompt_indices, fmt, include_usage, served, marker), on_close=close)


class ServedBy:
    """Which instances and versions served one request: the request state the headers and the
    access log read, and the per-version metrics."""

    def __init__(self, request: Request, choices: ChoiceSet, metrics: CoordinatorMetrics | None, model: str,
                 lora: str | None = None):
        self.request, self.choices, self.metrics, self.model = request, choices, metrics, model
        # an adapter's requests count for their base model and for the adapter's own name too (what
        # the canary analysis of a new adapter version judges)
        self.labels = (model, lora) if lora else (model,)
        self.error = False
        self.counted = False

    def _router(self):
        return self.choices.generations[0].router if self.choices.generations else None

    def _instances(self) -> list[str]:
        return [g.instances[-1] for g in self.choices.generations if g.instances]

    def _publish(self) -> list[str]:
        router = self._router()
        instances = self._instances()
        versions = [router.version_of(i) for i in instances] if router is not None else []
        state = self.request.state
        state.instances = ",".join(dict.fromkeys(instances))
        state.versions = ",".join(dict.fromkeys(v for v in versions if v))
        return versions

    def started(self) -> None:
        """Every choice has its first piece: the instances are known, the TTFTs too."""
        self._publish()
        if self.metrics is None:
            return
        for generation in self.choices.generations:
            timer = generation.timer
            if generation.instances and timer.first is not None:
                version = self._router().version_of(generation.instances[-1])
                for label in self.labels:
                    self.metrics.version_ttft.labels(label, version).observe(timer.first - timer.arrival)

    def failed(self, exc: BaseException) -> None:
        if version_fault(exc):
            self.error = True

    def finish(self) -> None:
        """The response ended (or failed): count the request for its first choice's version."""
        versions = self._publish()
        if self.counted or self.metrics is None or not versions:
            return
        self.counted = True
        for label in self.labels:
            self.metrics.version_requests.labels(label, versions[0]).inc()
            if self.error:
                self.metrics.version_errors.labels(label, versions[0]).inc()


def version_fault(exc: BaseException) -> bool:
    """The serving version caused this error: a 5xx (anything unexpected becomes a 500) and a 400
    the instance gave a request the coordinator's own rules accepted (`RefusedByInstance`) yes; any
    other 4xx (the request's own fault, or 429: every instance busy) and the client's going away no."""
    if isinstance(exc, (asyncio.CancelledError, ClientGone)):
        return False
    if isinstance(exc, RefusedByInstance):
        return True
    if isinstance(exc, APIError):
        return exc.status >= 500
    return True


async def _collect(choices: ChoiceSet, prompt_indices: list[int]) -> list[ChoiceResult]:
    results = [ChoiceResult(prompt_index=p) for p in prompt_indices]
    async for index, piece in choices.events():
        results[index].add(piece)
    return results


async def _events(choices: ChoiceSet, prompt_indices: list[int], fmt: OutputFormat,
                  include_usage: bool, served: ServedBy, marker: StreamMarker | None = None) -> AsyncIterator[bytes]:
    """The stream's events; with a `marker`, each with the id a client resumes from (resume.py)."""
    resumed = marker is not None and marker.resumed
    usages: list[tuple[int, Usage | None]] = []
    try:
        if resumed:
            usages = [(prompt_indices[i], usage) for i, usage in marker.finished_usages()]
        else:
            for index in range(len(prompt_indices)):
                for chunk in fmt.stream_start(index):
                    yield event(chunk, marker and marker.chunk_id(index, chunk))
        async for index, piece in choices.events():
            if marker is not None:
                marker.on_piece(index, piece)
            for chunk in fmt.stream_piece(index, piece):
                yield event(chunk, marker and marker.chunk_id(index, chunk))
            if piece.finish_reason is not None:
                usages.append((prompt_indices[index], piece.usage))
        if include_usage and not (resumed and marker.marks.usage_sent):
            yield event(fmt.usage_chunk(total_usage(usages)), marker and marker.usage_id())
    except APIError as exc:
        served.failed(exc)
        yield event(fmt.stream_error(exc))
    if fmt.stream_end is not None:
        yield fmt.stream_end
