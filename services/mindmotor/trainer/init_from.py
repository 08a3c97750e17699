"""Starting a run from an existing checkpoint instead of from scratch.

- `--init-from DIR` (fine-tune / continue training on another corpus): the model's shape comes
  from DIR's `config.json` (any Llama or Qwen2 Hugging Face directory), its weights from
  `model.safetensors` (fp32, fp16 or bf16; trained in fp32), and its tokenizer from DIR. The
  optimizer, the schedule and the step count start fresh (step 0); `--resume` is the way to
  continue a run exactly where it stopped, and the two do not combine.
- `--tokenizer-from DIR` (implied by `--init-from`): no tokenizer is trained; DIR's
  `tokenizer.json` and `tokenizer_config.json` (chat template, special tokens) are used and
  written into every checkpoint byte for byte, so their digest — what the Deployer compares when
  a version is rolled out next to another — stays the same. The model's vocabulary is the
  tokenizer's size (unless a larger `vocab_size` is set).

`init_source` reads and checks what it can without PyTorch (the CLI refuses a bad directory
before any work: `ConfigError`); `shaped_like` fits a config to the source.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from mindmotor.common.tokenizer import Tokenizer, TokenizerError, TokenizerFiles
from mindmotor.model.config import CheckpointError, LlamaConfig

from .config import ConfigError, TrainConfig

# TrainConfig fields that a checkpoint's config.json decides when a run starts from it.
SHAPE_FROM_CHECKPOINT = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                         "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                         "rope_theta", "rms_norm_eps", "tie_word_embeddings", "attention_bias")


@dataclass(frozen=True)
class TokenizerSource:
    directory: Path
    files: TokenizerFiles
    vocab_size: int                 # ids the tokenizer can produce (added tokens included)
    eos_token_id: int | None

    @property
    def digest(self) -> str:
        return self.files.digest()


@dataclass(frozen=True)
class InitSource:
    directory: Path
    model_config: LlamaConfig
    version: str | None             # its manifest's version, when it has one (the new run's parent)
    flag: str = "--init-from"       # how the user named it (for messages)


def tokenizer_source(directory: str | Path) -> TokenizerSource:
    directory = Path(directory).expanduser().resolve()
    if not directory.is_dir():
        raise ConfigError(f"--tokenizer-from {directory}: not a directory")
    try:
        files = TokenizerFiles.read(directory)
        tokenizer = Tokenizer.from_files(files, str(directory))
    except (TokenizerError, OSError, ValueError) as exc:
        raise ConfigError(f"--tokenizer-from {directory}: {exc}") from None
    eos = tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None
    return TokenizerSource(directory, files, tokenizer.vocab_size, eos)


def beyond_training_model(config: LlamaConfig) -> str | None:
    """What of `config` the PyTorch training model would silently compute differently, if anything
    (it is Llama / Qwen2 with SiLU, default RoPE, full attention, no o_proj bias)."""
    if config.architecture not in ("LlamaForCausalLM", "Qwen2ForCausalLM"):
        return f"architecture {config.architecture}"
    if config.hidden_act != "silu":
        return f"hidden_act {config.hidden_act!r}"
    if config.rope.rope_type != "default":
        return f"rope_type {config.rope.rope_type!r}"
    if config.sliding_window is not None:
        return "sliding_window"
    if config.o_bias:
        return "attention_bias on o_proj"
    return None


def init_source(directory: str | Path, flag: str = "--init-from") -> InitSource:
    directory = Path(directory).expanduser().resolve()
    if not directory.is_dir():
        raise ConfigError(f"{flag} {directory}: not a directory")
    try:
        model_config = LlamaConfig.from_dir(directory)
    except CheckpointError as exc:
        raise ConfigError(f"{flag} {directory}: {exc}") from None
    if not (directory / "model.safetensors").is_file():
        raise ConfigError(f"{flag} {directory}: model.safetensors missing (sharded weights are not "
                          "supported)")
    beyond = beyond_training_model(model_config)
    if beyond:
        raise ConfigError(f"{flag} {directory}: the trainer's model does not implement {beyond} "
                          f"(it trains Llama / Qwen2 with default RoPE)")
    if model_config.head_dim * model_config.num_attention_heads != model_config.hidden_size:
        raise ConfigError(f"{flag} {directory}: head_dim {model_config.head_dim} × "
                          f"{model_config.num_attention_heads} heads is not hidden_size "
                          f"{model_config.hidden_size}; the trainer's attention needs them equal")
    from mindmotor.model.manifest import MANIFEST_NAME, read_manifest

    version = None
    if (directory / MANIFEST_NAME).is_file():
        try:
            version = read_manifest(directory).get("version")
        except CheckpointError:
            version = None
    return InitSource(directory, model_config, version, flag)


def shaped_like(config: TrainConfig, init: InitSource | None, tokenizer: TokenizerSource | None,
                explicit: set[str]) -> TrainConfig:
    """`config` with the shape of `init` (a key set explicitly to another value is an error) and a
    vocabulary that holds every id of `tokenizer`."""
    if init is not None:
        shape = {name: getattr(init.model_config, name) for name in SHAPE_FROM_CHECKPOINT}
        clashes = sorted(n for n in explicit & set(shape) if getattr(config, n) != shape[n])
        if clashes:
            raise ConfigError(f"{init.flag} {init.directory}: its config.json sets "
                              + ", ".join(f"{n}={shape[n]!r}" for n in clashes)
                              + "; the run cannot change them (got "
                              + ", ".join(f"{n}={getattr(config, n)!r}" for n in clashes) + ")")
        config = dataclasses.replace(config, **shape)
        if config.seq_len > config.max_position_embeddings:
            raise ConfigError(f"seq_len {config.seq_len} exceeds the checkpoint's max_position_embeddings "
                              f"{config.max_position_embeddings}")
    if tokenizer is not None:
        if init is None and "vocab_size" not in explicit:
            config = dataclasses.replace(config, vocab_size=tokenizer.vocab_size)
        if tokenizer.vocab_size > config.vocab_size:
            raise ConfigError(f"the tokenizer of {tokenizer.directory} has {tokenizer.vocab_size} tokens but the "
                              f"model's vocab_size is {config.vocab_size}")
    config.check_shapes()
    return config


def load_init_weights(model, directory: Path) -> None:
    """DIR's weights (any float dtype) into the PyTorch model, as float32; CheckpointError naming
    the tensors that do not fit."""
    import torch
    from safetensors.torch import load_file

    tensors = {name: t.to(torch.float32) for name, t in load_file(str(directory / "model.safetensors")).items()}
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    expected = {n: tuple(t.shape) for n, t in model.hf_state_dict().items()}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    wrong = sorted(n for n in set(expected) & set(tensors) if tuple(tensors[n].shape) != expected[n])
    if missing or unexpected or wrong:
        parts = [f"{label}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
                 for label, names in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong))
                 if names]
        raise CheckpointError(f"{directory / 'model.safetensors'}: does not fit its config.json ({'; '.join(parts)})")
    model.load_hf_state_dict(tensors)
