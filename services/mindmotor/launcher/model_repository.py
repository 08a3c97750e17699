"""A Triton model repository as what `mindmotor up` serves (`up --model-repository DIR`).

    DIR/
      qwen-chat/
        config.pbtxt          platform: "mindmotor_llm" ...

Each subdirectory with a `config.pbtxt` is one model, named by its directory (Triton's rule; a
`name` in the file must agree): the served model name requests ask for. The file is Triton's protobuf text format, parsed against Triton's
own `ModelConfig` schema (`tritonclient`'s `model_config_pb2`, when installed: any valid Triton
section is accepted and a misspelt field is an error) or else against the subset below, with
google.protobuf's `text_format`. What it maps to:

    platform: "mindmotor_llm"                      required (Triton's "mindie_llm" names MindIE)
    max_batch_size: 32                             --max-num-seqs 32 (0: the worker's default)
    dynamic_batching {
      preferred_batch_size: [ 4, 8, 16 ]           --preferred-batch-size 4 (the smallest: an idle
                                                   engine starts once one preferred size is waiting)
      max_queue_delay_microseconds: 2000           --batch-timeout-s 0.002 (absent or 0: no wait)
    }
    parameters { key: "checkpoint" value: { string_value: "1/model" } }
                                                   the checkpoint directory, relative to the model's
                                                   directory (absent: the bundled demo model)
    parameters { key: "workers" ... }              also "device", "emulate", "tp", "timing": the
                                                   ModelSpec fields of the same names

Any other parameter is an error naming it. Other Triton sections (input, output, instance_group,
...) describe Triton's own serving and are ignored.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

PLATFORM = "mindmotor_llm"
CONFIG_NAME = "config.pbtxt"
CHECKPOINT = "checkpoint"        # the parameter naming the model's checkpoint directory
PARAMETERS = (CHECKPOINT, "workers", "device", "emulate", "tp", "timing")


class RepositoryError(ValueError):
    """The model repository cannot be served as it is; the message names the file and the field."""


@lru_cache(maxsize=1)
def _subset_message():
    """The part of Triton's ModelConfig this module reads, with Triton's names and field numbers."""
    f = descriptor_pb2.FileDescriptorProto(name="mindmotor_model_config.proto", package="mindmotor.triton",
                                           syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto
    opt, rep = T.LABEL_OPTIONAL, T.LABEL_REPEATED

    def message(name, fields, nested=()):
        m = f.message_type.add(name=name) if not nested else nested
        for field_name, number, ftype, label, type_name in fields:
            field = m.field.add(name=field_name, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = type_name
        return m

    message("ModelParameter", [("string_value", 1, T.TYPE_STRING, opt, None)])
    message("Opaque", [])                 # a Triton section this module ignores: its fields are skipped
    message("ModelDynamicBatching", [("preferred_batch_size", 1, T.TYPE_INT32, rep, None),
                                     ("max_queue_delay_microseconds", 2, T.TYPE_UINT64, opt, None)])
    config = message("ModelConfig", [
        ("name", 1, T.TYPE_STRING, opt, None), ("platform", 2, T.TYPE_STRING, opt, None),
        ("max_batch_size", 4, T.TYPE_INT32, opt, None),
        ("dynamic_batching", 11, T.TYPE_MESSAGE, opt, ".mindmotor.triton.ModelDynamicBatching"),
        ("parameters", 14, T.TYPE_MESSAGE, rep, ".mindmotor.triton.ModelConfig.ParametersEntry"),
        ("backend", 17, T.TYPE_STRING, opt, None)]
        + [(name, number, T.TYPE_MESSAGE, label, ".mindmotor.triton.Opaque") for name, number, label in (
            ("version_policy", 3, opt), ("input", 5, rep), ("output", 6, rep), ("instance_group", 7, rep),
            ("optimization", 12, opt), ("sequence_batching", 13, opt), ("ensemble_scheduling", 15, opt),
            ("model_warmup", 16, rep), ("model_operations", 18, opt), ("model_transaction_policy", 19, opt),
            ("batch_input", 20, rep), ("batch_output", 21, rep), ("model_repository_agents", 23, opt),
            ("response_cache", 24, opt))])
    entry = config.nested_type.add(name="ParametersEntry")
    entry.options.map_entry = True
    message("", [("key", 1, T.TYPE_STRING, opt, None),
                 ("value", 2, T.TYPE_MESSAGE, opt, ".mindmotor.triton.ModelParameter")], nested=entry)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("mindmotor.triton.ModelConfig"))


def _model_config_class():
    """Triton's own ModelConfig when tritonclient is installed, else the subset; (class, strict)."""
    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError:
        return _subset_message(), False
    return model_config_pb2.ModelConfig, True


def parse_config(text: str, where: str = CONFIG_NAME, triton_schema: bool = True):
    """The parsed ModelConfig message; RepositoryError naming `where` and the parser's complaint."""
    cls, strict = _model_config_class() if triton_schema else (_subset_message(), False)
    message = cls()
    try:
        # the subset cannot know every Triton section: it skips what it does not declare
        text_format.Parse(text, message, allow_unknown_field=not strict)
    except text_format.ParseError as exc:
        raise RepositoryError(f"{where}: {exc}") from None
    return message


def model_spec(model_dir: Path, triton_schema: bool = True) -> dict:
    """The `ModelSpec` fields (launcher/config.py) of one model directory of the repository."""
    path = model_dir / CONFIG_NAME
    where = str(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise RepositoryError(f"{where}: cannot be read ({exc})") from None
    cfg = parse_config(text, where, triton_schema)
    if cfg.platform != PLATFORM:
        raise RepositoryError(f"{where}: platform must be {PLATFORM!r} (got {cfg.platform or 'none'!r}): this "
                              "repository's models are served by MindMotor's workers")
    if cfg.name and cfg.name != model_dir.name:
        raise RepositoryError(f"{where}: name {cfg.name!r} differs from its directory {model_dir.name!r} "
                              "(Triton names a model by its directory)")
    if cfg.max_batch_size < 0:
        raise RepositoryError(f"{where}: max_batch_size must be at least 0, got {cfg.max_batch_size}")
    from .deployments import deployment_name

    # requests ask for the Triton model's name; the deployment's name is that made a valid one
    spec: dict = {"name": deployment_name(model_dir.name, 0), "served_model_name": model_dir.name}
    extra: list[str] = []
    if cfg.max_batch_size > 0:
        extra += ["--max-num-seqs", str(cfg.max_batch_size)]
    if cfg.HasField("dynamic_batching"):
        db = cfg.dynamic_batching
        sizes = list(db.preferred_batch_size)
        if any(n < 1 for n in sizes) or (cfg.max_batch_size > 0 and any(n > cfg.max_batch_size for n in sizes)):
            raise RepositoryError(f"{where}: dynamic_batching.preferred_batch_size {sizes} must be between 1 and "
                                  f"max_batch_size ({cfg.max_batch_size})")
        if sizes:
            extra += ["--preferred-batch-size", str(min(sizes))]
        if db.max_queue_delay_microseconds:
            extra += ["--batch-timeout-s", repr(db.max_queue_delay_microseconds / 1e6)]
    for key, value in sorted(cfg.parameters.items()):
        if key not in PARAMETERS:
            raise RepositoryError(f"{where}: unknown parameter {key!r}; known: {', '.join(PARAMETERS)}")
        text_value = value.string_value
        if key == CHECKPOINT:
            checkpoint = Path(text_value)
            spec["path"] = str(checkpoint if checkpoint.is_absolute() else (model_dir / checkpoint).resolve())
        else:
            spec[key] = text_value
    if extra:
        spec["extra_args"] = extra
    return spec


def load_repository(directory: str | Path, triton_schema: bool = True) -> list[dict]:
    """The `ModelSpec` fields of every model of the repository at `directory` (sorted by name);
    RepositoryError when it holds none or one cannot be served."""
    root = Path(directory)
    if not root.is_dir():
        raise RepositoryError(f"model repository {str(root)!r} is not a directory")
    models = [model_spec(d, triton_schema) for d in sorted(root.iterdir())
              if d.is_dir() and (d / CONFIG_NAME).is_file()]
    if not models:
        raise RepositoryError(f"model repository {str(root)!r} holds no model (no <name>/{CONFIG_NAME})")
    return models
