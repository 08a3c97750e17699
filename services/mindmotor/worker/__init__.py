"""The worker: a gRPC server (worker.proto) around one engine on one emulated NPU.

    cli.py        `mindmotor worker` flags -> WorkerConfig
    config.py     WorkerConfig and the ready line
    server.py     lifecycle: load, serve gRPC + health + /metrics, drain on SIGTERM, stop
    service.py    the Worker RPCs: Generate, Abort, Status, ModelInfo, Drain
    model_info.py the ModelInfo answer (served name, tokenizer files), read once at start
    admission.py  serving/draining state and the requests in flight
    convert.py    proto <-> engine types
    metrics.py    Prometheus collector, TTFT/TPOT histograms, the side port
    client.py     sync helpers for tools (`fetch_status` for npu-smi)
"""
