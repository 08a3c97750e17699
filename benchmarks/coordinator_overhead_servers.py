"""Servers for `coordinator_overhead.py`, each run as its own process (`python THIS_FILE KIND ...`),
printing `BENCH_SERVER_READY port=N` on stdout once it serves; SIGTERM stops it.

- `bare [HOST]`: a trivial FastAPI app on uvicorn (one process; it binds the socket itself):
  `POST /v1/completions` reads and parses the JSON body and returns a small JSON object;
  `GET /health` returns {"status": "ok"}. The floor a Python ASGI server sets on this host.
- `proxy WORKER_ADDRESS`: the least a FastAPI front door to a worker can do: `POST /v1/completions`
  parses the JSON body, sends the prompt's token ids and the sampling fields the benchmark uses
  (max_tokens, temperature, ignore_eos) to the worker in one unary `GenerateUnary` call, on a
  channel made as the coordinator makes its own (`WorkerChannels`: the same options, the same mTLS
  when configured), and answers OpenAI's completion JSON. No auth, limits, routing, metrics or logs:
  the floor the coordinator's own work sits on.

`bare` and `proxy` run on the server stack the coordinator runs on: `MINDMOTOR_BENCH_LOOP` (auto,
asyncio, uvloop) and `MINDMOTOR_BENCH_HTTP` (auto, h11, httptools), default auto for both —
uvloop and httptools where installed, as the coordinator's defaults.
- `coordinator ARGS...`: `mindmotor coordinator ARGS...` run inside this helper, so that it can be
  profiled (below); its ready line is the helper's as well as the coordinator's own.

With `MINDMOTOR_BENCH_CPROFILE=FILE` either server runs under cProfile and writes its stats to FILE
when it stops (the benchmark's `--profile`).
"""

import asyncio
import os
import signal
import sys

READY = "BENCH_SERVER_READY"


def bare_app():
    import json

    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from starlette.requests import Request

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = json.loads(await request.body())
        return JSONResponse({"id": "cmpl-bare", "object": "text_completion", "model": body.get("model", ""),
                             "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                             "usage": {"prompt_tokens": 0, "completion_tokens": 1, "total_tokens": 1}})

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    return app


def proxy_app(worker: str):
    import json

    from fastapi import FastAPI
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    from mindmotor.coordinator.dispatch.channels import WorkerChannels
    from mindmotor.protocol import worker_pb2 as pb

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    channels = WorkerChannels()

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = json.loads(await request.body())
        req = pb.GenerateRequest(sampling=pb.SamplingParams(max_tokens=body.get("max_tokens", 16),
                                                            temperature=body.get("temperature", 1.0),
                                                            ignore_eos=body.get("ignore_eos", False)))
        req.prompt_token_ids.ids.extend(body["prompt"])
        out = await channels.stub(worker).GenerateUnary(req)
        if not out.finish_reason:
            return Response(status_code=502)
        return JSONResponse({"id": f"cmpl-{out.request_id}", "object": "text_completion",
                             "model": body.get("model", ""),
                             "choices": [{"index": 0, "text": out.text, "finish_reason": out.finish_reason}],
                             "usage": {"prompt_tokens": out.usage.prompt_tokens,
                                       "completion_tokens": out.usage.completion_tokens,
                                       "total_tokens": out.usage.prompt_tokens + out.usage.completion_tokens}})

    return app


def stack() -> tuple[str, str]:
    """(event loop, HTTP parser) of this run, as the coordinator resolves them."""
    from mindmotor.common.event_loop import loop_name
    from mindmotor.common.http_limits import resolve_protocol

    return (loop_name(os.environ.get("MINDMOTOR_BENCH_LOOP", "auto")),
            resolve_protocol(os.environ.get("MINDMOTOR_BENCH_HTTP", "auto")))


async def serve_app(app, host: str) -> int:
    import uvicorn

    _, http = stack()
    config = uvicorn.Config(app, host=host, port=0, log_config=None, access_log=False, log_level="warning",
                            http=http)
    server = uvicorn.Server(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    server.capture_signals = _no_signal_capture
    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if server.started:
        port = server.servers[0].sockets[0].getsockname()[1]
        print(f"{READY} port={port}", flush=True)
    await task
    return 0


def _no_signal_capture():
    import contextlib
    return contextlib.nullcontext()


def run_coordinator(argv: list[str], on_ready=None) -> int:
    import argparse

    from mindmotor.coordinator import cli, config
    from mindmotor.coordinator.http import server

    real_ready_line = config.ready_line

    def ready_line(port, *more):
        if on_ready is not None:
            on_ready()
        return f"{READY} port={port}\n{real_ready_line(port, *more)}"

    server.ready_line = ready_line
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.run_coordinator(parser.parse_args(argv))


def main(argv: list[str]) -> int:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    kind, rest = argv[0], argv[1:]
    if kind in ("bare", "proxy"):
        from mindmotor.common.event_loop import run as run_on_loop

        app = bare_app() if kind == "bare" else proxy_app(rest[0])
        host = "127.0.0.1" if kind == "proxy" or not rest else rest[0]
        run = lambda: run_on_loop(serve_app(app, host), stack()[0])  # noqa: E731
    elif kind == "coordinator":
        run = None
    else:
        print(f"unknown server kind {kind!r}", file=sys.stderr)
        return 2
    profile_path = os.environ.get("MINDMOTOR_BENCH_CPROFILE")
    if not profile_path:
        return run() if run is not None else run_coordinator(rest)
    import cProfile
    import time

    # CPU time of the event loop's thread (on a shared host, wall time counts the waits for a core);
    # the coordinator's from when it serves (its start-up left out)
    prof = cProfile.Profile(time.thread_time)
    try:
        if run is not None:
            return prof.runcall(run)
        return run_coordinator(rest, on_ready=prof.enable)
    finally:
        prof.disable()
        prof.dump_stats(profile_path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
