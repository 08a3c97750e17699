"""Servers for `coordinator_overhead.py`, each run as its own process (`python THIS_FILE KIND ...`),
printing `BENCH_SERVER_READY port=N` on stdout once it serves; SIGTERM stops it.

- `bare`: a trivial FastAPI app on uvicorn (one process, uvicorn's defaults: it binds the socket
  itself): `POST /v1/completions` reads and parses the JSON body and returns a small JSON object;
  `GET /health` returns {"status": "ok"}. The floor a Python ASGI server sets on this host.
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


async def serve_bare(host: str) -> int:
    import uvicorn

    # h11, as the coordinator's default (`http_protocol`): uvicorn's "auto" would take httptools
    # wherever it is installed (the test extras have it), and the ratio would compare two parsers
    config = uvicorn.Config(bare_app(), host=host, port=0, log_config=None, access_log=False, log_level="warning",
                            http="h11")
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


def run_coordinator(argv: list[str]) -> int:
    import argparse

    from mindmotor.coordinator import cli, config
    from mindmotor.coordinator.http import server

    real_ready_line = config.ready_line
    server.ready_line = lambda port, *more: f"{READY} port={port}\n{real_ready_line(port, *more)}"
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.run_coordinator(parser.parse_args(argv))


def main(argv: list[str]) -> int:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    kind, rest = argv[0], argv[1:]
    if kind == "bare":
        run = lambda: asyncio.run(serve_bare(rest[0] if rest else "127.0.0.1"))  # noqa: E731
    elif kind == "coordinator":
        run = lambda: run_coordinator(rest)  # noqa: E731
    else:
        print(f"unknown server kind {kind!r}", file=sys.stderr)
        return 2
    profile_path = os.environ.get("MINDMOTOR_BENCH_CPROFILE")
    if not profile_path:
        return run()
    import cProfile

    prof = cProfile.Profile()
    try:
        return prof.runcall(run)
    finally:
        prof.dump_stats(profile_path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
