"""Training: a Llama-architecture model in PyTorch, trained on a corpus of text or source files,
exported as Hugging Face checkpoint versions the serving engine loads.

    config.py    TrainConfig, the presets (`tiny`, `demo`), ConfigError
    corpus.py    which files make the corpus (default: the Python stdlib sources)
    data.py      tokenize, pack, split, sample batches
    model.py     the PyTorch model (HF LlamaForCausalLM parameter layout)
    loop.py      one training run: train(config, store_root, RunOptions) -> TrainResult
    launch.py    one process, `--nproc N` local processes, or a torchrun member
    export.py    writing a checkpoint version atomically
    manifest.py  mindmotor.json and verify_checkpoint(dir)      (no torch: serving imports it)
    store.py     CheckpointStore: versions, latest, promote       (no torch)
    resume.py    continuing from a checkpoint
    bundle.py    a serving-only copy of a checkpoint (no optimizer state)   (no torch)
    jobs.py, service.py, metrics.py   the Trainer gRPC service   (no torch)
    compare.py   PyTorch vs numpy model, per layer
    cli.py       `mindmotor train | trainer | debug compare | checkpoints`

Importing this package imports nothing heavy; only the training modules need PyTorch.
"""
