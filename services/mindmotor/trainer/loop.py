"""One training run: data → model → optimizer steps → validation → checkpoints.

    result = train(load_config("tiny", {"steps": 50}), "checkpoints/", RunOptions(run_name="a"))

Runs in every process of a data-parallel group (see `distributed.py`); rank 0 alone trains the
tokenizer (the others receive it), reports progress and writes checkpoints. Each optimizer step
sees the same global batch whatever the number of processes, so 1 and N processes follow the same
loss curve up to floating-point reassociation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer as HFTokenizer

from mindmotor.common.tokenizer import EOS_TOKEN, TokenizerFiles, train_bpe

from .config import TrainConfig
from .corpus import corpus_digest, read_documents
from .data import PackedData, eval_shard, global_batch_indices, micro_batches, pack, token_stream
from .distributed import (DistContext, all_reduce_sum, average_gradients, barrier,
                          broadcast_object, broadcast_parameters, gather_objects, init_from_env,
                          shutdown)
from .export import CheckpointInfo, export_checkpoint
from .interrupt import StopRequest
from .model import LlamaForCausalLM
from .progress import ProgressReporter, SilentReporter
from .resume import capture_rng, load_resume_point, trainer_state
from .schedule import lr_at
from .store import CheckpointStore

log = logging.getLogger("mindmotor.trainer")


@dataclass
class RunOptions:
    run_name: str | None = None        # versions are named `<run_name>-step<NNNNNN>`
    resume: str | None = None          # latest | promoted | a version name | a checkpoint path
    init_from: str | None = None       # a checkpoint directory whose weights the run starts from
    tokenizer_from: str | None = None  # a checkpoint directory whose tokenizer the run keeps
    events_path: str | None = None     # JSON-lines progress events (for the trainer service)
    stop_after_step: int | None = None  # stop (with a checkpoint) after this step
    show_progress: bool = True


@dataclass
class TrainResult:
    start_step: int = 0
    losses: list[float] = field(default_factory=list)          # one per step run, in order
    val_losses: dict[int, float] = field(default_factory=dict)  # step → validation loss
    checkpoints: list[str] = field(default_factory=list)        # versions written


def train(config: TrainConfig, store_root: str | Path, options: RunOptions | None = None) -> TrainResult:
    options = options or RunOptions()
    ctx = init_from_env()
    reporter = (ProgressReporter(options.events_path, options.show_progress) if ctx.is_main
                else SilentReporter())
    try:
        return Run(config, Path(store_root), options, ctx, reporter).execute()
    except BaseException as exc:
        reporter.error(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        reporter.close()
        shutdown(ctx)


def default_run_name() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]


class Run:
    def __init__(self, config: TrainConfig, store_root: Path, options: RunOptions,
                 ctx: DistContext, reporter: ProgressReporter):
        config.check_world_size(ctx.world_size)
        self.config, self.options, self.ctx, self.reporter = config, options, ctx, reporter
        self.store = CheckpointStore(store_root)
        self.run_name = broadcast_object(options.run_name or default_run_name(), ctx)
        self.resume_dir = self.store.resolve(options.resume) if options.resume else None
        self.result = TrainResult()
        self.parent: str | None = None
        self.tokenizer_files: TokenizerFiles | None = None   # kept byte for byte (not trained here)
        self.eos_id: int | None = None

    # ---- the run, top to bottom -------------------------------------------------------------
    def execute(self) -> TrainResult:
        cfg = self.config
        self.seed_everything()
        documents = read_documents(cfg.corpus, cfg.max_corpus_bytes)
        self.corpus_digest = corpus_digest(documents)
        self.tokenizer = self.fit_tokenizer(documents)
        self.data: PackedData = pack(token_stream(self.tokenizer, documents, self.eos_id), cfg.seq_len,
                                     cfg.val_fraction)
        self.model = self.build_model()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = self.build_optimizer()
        self.scaler = torch.amp.GradScaler("cpu") if cfg.precision == "fp16" else None
        start = self.resume() if self.resume_dir else 0
        self.result.start_step = start
        self.reporter.start(total_steps=cfg.steps, start_step=start, run=self.run_name,
                            world_size=self.ctx.world_size, train_sequences=len(self.data.train),
                            val_sequences=len(self.data.val),
                            num_parameters=self.model.config.num_parameters(),
                            tokens_per_step=cfg.batch_size * cfg.seq_len)
        with StopRequest() as stop:
            for step in range(start, cfg.steps):
                interrupted = self.run_step(step, stop)
                done = step + 1
                stopping = interrupted or (self.options.stop_after_step is not None
                                           and done >= self.options.stop_after_step)
                checkpoint_due = done % cfg.checkpoint_interval == 0 or done == cfg.steps or stopping
                val_loss = None
                # Interrupted: no validation pass (it can take longer than the sender's grace period).
                if done % cfg.eval_interval == 0 or (checkpoint_due and not interrupted):
                    val_loss = self.evaluate(done)
                if checkpoint_due:
                    self.save_checkpoint(done, val_loss)
                if interrupted:
                    self.reporter.interrupted(step=done, total_steps=cfg.steps,
                                              version=self.result.checkpoints[-1] if self.result.checkpoints else None)
                    stop.exit()
                if stopping:
                    break
        self.reporter.done(step=start + len(self.result.losses), run=self.run_name,
                           checkpoints=self.result.checkpoints,
                           final_loss=self.result.losses[-1] if self.result.losses else None)
        return self.result

    def seed_everything(self) -> None:
        seed = self.config.seed + self.ctx.rank
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)

    def fit_tokenizer(self, documents) -> HFTokenizer:
        """The resumed checkpoint's tokenizer, or --tokenizer-from's (both kept byte for byte), or
        a BPE trained (by rank 0) on the corpus."""
        source = self.resume_dir or (Path(self.options.tokenizer_from) if self.options.tokenizer_from else None)
        if source is not None:
            from .init_from import tokenizer_source

            found = tokenizer_source(source)
            self.tokenizer_files, self.eos_id = found.files, found.eos_token_id
            log.info("tokenizer kept", extra={"from": str(source), "digest": found.digest,
                                              "vocab_size": found.vocab_size})
            return HFTokenizer.from_str(found.files.tokenizer_json.decode())
        text = None
        if self.ctx.is_main:
            log.info("training tokenizer", extra={"documents": len(documents),
                                                             "vocab_size": self.config.vocab_size})
            text = train_bpe((d.text for d in documents), vocab_size=self.config.vocab_size,
                             min_frequency=self.config.tokenizer_min_frequency).to_str()
        return HFTokenizer.from_str(broadcast_object(text, self.ctx))

    def build_model(self) -> LlamaForCausalLM:
        cfg = self.config
        eos = self.eos_id if self.eos_id is not None else self.tokenizer.token_to_id(EOS_TOKEN)
        model_config = cfg.model_config(eos_token_id=eos)
        init = None
        source = self.options.init_from or self.resume_dir
        if source:                      # the architecture and special ids of the checkpoint it starts from
            from .init_from import init_source, load_init_weights

            origin = init_source(source)
            model_config = dataclasses.replace(model_config, architecture=origin.model_config.architecture,
                                               bos_token_id=origin.model_config.bos_token_id,
                                               eos_token_id=origin.model_config.eos_token_id or eos)
            init = origin if self.options.init_from else None   # resuming loads its weights later
        model = LlamaForCausalLM(model_config, activation_checkpointing=cfg.activation_checkpointing)
        model.init_weights(cfg.init_std, torch.Generator().manual_seed(cfg.seed))
        if init is not None:
            load_init_weights(model, init.directory)
            self.parent = init.version
            log.info("weights loaded", extra={"from": str(init.directory), "parent": init.version})
        if cfg.lora_rank:
            from .lora import add_lora

            wrapped = add_lora(model, cfg.lora_rank, cfg.lora_alpha, set(cfg.lora_target_modules), cfg.seed)
            log.info("LoRA adapter", extra={"rank": cfg.lora_rank, "alpha": cfg.lora_alpha,
                                            "modules": len(wrapped)})
        broadcast_parameters(model, self.ctx)
        return model.train()

    def build_optimizer(self) -> torch.optim.Optimizer:
        """AdamW; weight decay on matrices (and embeddings), none on norms and biases."""
        cfg = self.config
        decay = [p for p in self.params if p.dim() >= 2]
        no_decay = [p for p in self.params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": cfg.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=1e-8)

    def resume(self) -> int:
        point = load_resume_point(self.resume_dir, self.model, self.optimizer, self.scaler,
                                  self.config, self.corpus_digest, self.ctx)
        self.parent = point.version
        log.info("resumed", extra={"from": str(self.resume_dir), "step": point.step})
        return point.step

    # ---- one optimizer step -----------------------------------------------------------------
    def run_step(self, step: int, stop: StopRequest | None = None) -> bool:
        """One optimizer step; True when any process was asked to stop (all agree on it: the
        flags are summed with the loss, so every process stops after the same step)."""
        cfg, ctx = self.config, self.ctx
        started = time.perf_counter()
        lr = lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        indices = global_batch_indices(step, cfg.batch_size, len(self.data.train), cfg.seed)
        batches = micro_batches(self.data.train, indices, ctx.rank, ctx.world_size,
                                cfg.micro_batch_size)
        local_loss = 0.0
        for block in batches:
            inputs, targets = split_block(block)
            with self.autocast():
                loss = self.model.loss(inputs, targets) / len(batches)
            self.backward(loss)
            local_loss += loss.item()
        average_gradients(self.params, ctx)
        grad_norm = self.optimizer_step()
        loss_sum, stops = all_reduce_sum([local_loss, float(stop is not None and stop.requested)], ctx)
        loss = loss_sum / ctx.world_size
        self.result.losses.append(loss)
        elapsed = time.perf_counter() - started
        self.reporter.step(step=step + 1, loss=loss, lr=lr, grad_norm=grad_norm,
                           tokens_per_s=cfg.batch_size * cfg.seq_len / elapsed,
                           emit=(step + 1) % cfg.log_interval == 0 or step + 1 == cfg.steps)
        return stops > 0

    def autocast(self):
        precision = self.config.precision
        if precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return torch.autocast("cpu", dtype=dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def optimizer_step(self) -> float:
        """Unscale (fp16), clip, step, zero; returns the gradient norm before clipping."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        max_norm = self.config.grad_clip if self.config.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        if self.scaler is not None:
            self.scaler.step(self.optimizer)   # skipped when the scaled gradients overflowed
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    # ---- validation and checkpoints ---------------------------------------------------------
    def evaluate(self, step: int) -> float:
        """Mean token loss over the fixed validation set, shared out among the processes."""
        cfg = self.config
        shard = eval_shard(self.data.val, cfg.eval_batches * cfg.micro_batch_size,
                           self.ctx.rank, self.ctx.world_size)
        total, count = 0.0, 0
        self.model.eval()
        with torch.no_grad(), self.autocast():
            for i in range(0, len(shard), cfg.micro_batch_size):
                inputs, targets = split_block(shard[i:i + cfg.micro_batch_size])
                total += self.model.loss(inputs, targets).item() * targets.numel()
                count += targets.numel()
        self.model.train()
        total, count = all_reduce_sum([total, count], self.ctx)
        val_loss = total / count
        self.result.val_losses[step] = val_loss
        self.reporter.eval(step=step, val_loss=val_loss, val_perplexity=math.exp(min(val_loss, 50.0)))
        return val_loss

    def save_checkpoint(self, step: int, val_loss: float | None) -> None:
        if self.config.lora_rank:
            return self.save_adapter(step, val_loss)
        rng = gather_objects(capture_rng(), self.ctx)
        if self.ctx.is_main:
            version = f"{self.run_name}-step{step:06d}"
            info = CheckpointInfo(
                version=version, run=self.run_name, parent=self.parent, step=step,
                val_loss=val_loss, corpus_digest=self.corpus_digest,
                config_digest=self.config.digest(), train_config=self.config.to_dict(),
                world_size=self.ctx.world_size, init_from=self.options.init_from,
                tokenizer_from=self.options.tokenizer_from)
            state = trainer_state(step, self.optimizer, self.scaler, rng, self.config)
            path = export_checkpoint(self.store.root, info, self.model, self.tokenizer, state,
                                     tokenizer_files=self.tokenizer_files)
            self.parent = version
            self.result.checkpoints.append(version)
            self.reporter.checkpoint(step=step, version=version, path=str(path), val_loss=val_loss)
        barrier(self.ctx)


    def save_adapter(self, step: int, val_loss: float | None) -> None:
        """A LoRA run writes PEFT adapter directories (trainer/lora.py), not checkpoints."""
        from .lora import export_adapter

        cfg = self.config
        version = f"{self.run_name}-step{step:06d}"
        path = export_adapter(self.store.root, version, self.model, cfg.lora_rank, cfg.lora_alpha,
                              cfg.lora_target_modules, base_model=self.options.init_from,
                              info={"version": version, "run": self.run_name, "step": step, "val_loss": val_loss,
                                    "init_from": self.options.init_from, "corpus_digest": self.corpus_digest,
                                    "train_config": cfg.to_dict()})
        self.result.checkpoints.append(version)
        self.reporter.checkpoint(step=step, version=version, path=str(path), val_loss=val_loss)


def split_block(block: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, seq_len + 1] tokens → inputs [B, seq_len], targets [B, seq_len]."""
    return (torch.from_numpy(np.ascontiguousarray(block[:, :-1])),
            torch.from_numpy(np.ascontiguousarray(block[:, 1:])))
