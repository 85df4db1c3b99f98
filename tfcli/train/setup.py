"""What a training run is made of before its first step: the device and precision, the model (fresh, a
parent's weights or a checkpoint's) with what it freezes, and the data source for the task."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from tfcli.adapters import AdapterRecord, describe_parent
from tfcli.adapters.lora import apply_lora, check_rank
from tfcli.adapters.vocabulary import VOCABULARY_TENSORS, grow_vocabulary, vocabulary_modules
from tfcli.checkpoint import TIED_KEY, model_from_tensors
from tfcli.data.shards import open_shard
from tfcli.errors import TfcliError
from tfcli.loader import load_run
from tfcli.meta_device import on_meta_device
from tfcli.model.transformer import Transformer
from tfcli.quant.linear import QuantEmbedding, QuantLinear, held_tensors
from tfcli.quant.tensors import Blocks
from tfcli.rundir import weights_path
from tfcli.runtime import physical_memory, resolve_device
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.detokenize import text_byte_lengths
from tfcli.train import data as d
from tfcli.train import sharding
from tfcli.train.chat import ChatSource
from tfcli.train.data import derived_seed
from tfcli.train.distributed import World
from tfcli.train.flops import peak_matmul_flops, training_flops_per_token
from tfcli.train.job import ChatJob, LabeledJob, TrainingJob
from tfcli.train.optim import Optimizer, load_optimizer_tensors, make_optimizer
from tfcli.train.saving import best_saved_val_loss, lowest
from tfcli.train.state import OPTIMIZER_FILE, find_trainer_state, read_optimizer_tensors
from tfcli.training_config import TrainConfig


def pick_device(name: str, world: World | None = None) -> torch.device:
    """The device `resolve_device` checks; plain cuda means the local rank's GPU under torchrun."""
    name = resolve_device(name)
    if name == "cuda":
        index = world.local_rank if world is not None and world.enabled else torch.cuda.current_device()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device(name)


def use_bf16(precision: str, device: torch.device) -> bool:
    if precision == "bf16":
        return True
    return precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()


def freeze(model, how: str, task: str) -> None:
    if how == "embeddings":
        for module in (model.tok_emb, getattr(model, "pos_emb", None)):
            if module is not None:
                module.weight.requires_grad_(False)
    elif how == "body":
        if task != "classify":
            raise TfcliError("--freeze body leaves only the classification head to train; it needs --task classify")
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(name.startswith("classifier."))


def initial_model(job: TrainingJob, device: torch.device | None = None):
    """A fresh model, the parent's weights (finetune; a new head where the task needs one), or the
    checkpoint's (resume), built in this machine's memory; `device` is where it will train (its memory holds the
    activations)."""
    torch.manual_seed(derived_seed(job.config.seed, "init"))
    if not job.resume and not (job.init_from is not None and job.config.lora_rank is not None):
        refuse_what_memory_cannot_hold(job.model_config)  # first: a model too big for memory is the larger mistake
    refuse_a_batch_memory_cannot_hold(job.model_config, job.config.batch_size, device)
    if job.resume:
        return load_run(job.run_dir, "resume").model  # an adapter run: wrapped, as it trains
    if job.init_from is not None and job.config.lora_rank is not None:
        return _lora_model(job)
    model = Transformer(job.model_config)
    if job.init_from is not None:
        parent = load_run(job.init_from, "parent").model
        weights = parent.state_dict()
        if job.config.task == "classify":
            weights = {k: v for k, v in weights.items() if not k.startswith("classifier.")}
        if job.model_config.vocab_size > parent.config.vocab_size:  # a chat template's tokens were added
            weights = grow_vocabulary(weights, job.model_config.vocab_size)
        missing, unexpected = model.load_state_dict(weights, strict=False)
        fresh = ("classifier.", "pooler.") if job.config.task == "classify" else ()  # a new head (and a BERT's pooler)
        assert not unexpected and all(k.startswith(fresh) for k in missing), (missing, unexpected)
    return model


def refuse_what_memory_cannot_hold(config) -> None:
    """A model whose weights alone (fp32, built in this machine's memory before any move to a GPU) exceed
    the memory would end in an allocation error deep in torch or, worse, the kernel killing the process
    halfway through initialisation; say so first. Training needs about four times this (gradients, AdamW)."""
    total, weights = physical_memory(), 4 * config.parameter_estimate()
    if total and weights > total:
        raise TfcliError(
            f"the model's {config.parameter_estimate():,} parameters need {weights / 1e9:,.1f} GB for their weights alone; this machine has {total / 1e9:,.1f} GB",
            hint="choose a smaller model: --preset, or --set d_model, n_layers, d_ff",
        )


def refuse_a_batch_memory_cannot_hold(config, batch_size: int, device: torch.device | None = None) -> None:
    """A micro-batch whose activations cannot fit in the memory of the device that trains (a GPU's own, else this
    machine's): counted low (four float32 values per layer, position and model dimension, where a real step keeps
    several times that), so only a batch that surely fails is refused."""
    on_gpu = device is not None and device.type == "cuda"
    total = torch.cuda.get_device_properties(device).total_memory if on_gpu else physical_memory()
    need = 4 * 4 * batch_size * config.block_size * config.d_model * config.n_layers
    if total and need > total:
        holder = f"{torch.cuda.get_device_name(device)} has" if on_gpu else "this machine has"
        raise TfcliError(
            f"--batch-size {batch_size:,} of {config.block_size:,} tokens needs more than {need / 1e9:,.1f} GB for its activations; {holder} {total / 1e9:,.1f} GB",
            hint="use a smaller --batch-size (--set grad_accum=N keeps the tokens per step)",
        )


def _lora_model(job: TrainingJob):
    """The parent's weights, used as they are (the model is never held twice), a fresh head where the task
    adds one, frozen, with LoRA adapters on the target layers; the fresh modules and a grown vocabulary's
    train whole."""
    cfg = job.config
    weights = held_tensors(load_run(job.init_from, "lora-parent").model)  # a quantized parent's layers stay in their blocks (QLoRA)
    if job.model_config.tie_embeddings:
        weights.pop(TIED_KEY, None)  # the embedding's matrix (or bytes), tied again as the model is built
    weights, grown = _grown_for_lora(weights, job.model_config)
    if cfg.task == "classify":
        weights = {k: v for k, v in weights.items() if not k.startswith("classifier.")}
    with on_meta_device():
        skeleton = Transformer(job.model_config)
    missing = [k for k in skeleton.state_dict() if k not in weights and not (k == TIED_KEY and job.model_config.tie_embeddings)]
    new_modules = sorted({k.rpartition(".")[0] for k in missing})
    assert all(name in ("classifier", "pooler") for name in new_modules), new_modules
    for name in new_modules:  # a new head (and a BERT's pooler), initialised as the model initialises it
        module = skeleton.get_submodule(name).to_empty(device="cpu")
        skeleton.init_weights(module)
        weights.update({f"{name}.{key}": tensor for key, tensor in module.state_dict().items()})
    model = model_from_tensors(job.model_config, weights)
    record = AdapterRecord(
        rank=cfg.lora_rank,
        alpha=cfg.resolved_lora_alpha,
        dropout=cfg.lora_dropout,
        targets=list(cfg.lora_groups),
        modules=check_rank(job.model_config, cfg.lora_rank, cfg.lora_groups),
        modules_to_save=new_modules + grown,
        **describe_parent(job.init_from, weights_path(job.init_from)),
    )
    return apply_lora(model, record)


def _grown_for_lora(weights: dict, config) -> tuple[dict, list[str]]:
    """The parent's weights with the vocabulary grown to the config's (a chat template added tokens), and the
    modules that then train whole beside the adapters, as PEFT users train a resized embedding
    (`modules_to_save`): the embedding, and an untied output layer. With the parent's vocabulary: the weights as they are, and no module."""
    if config.vocab_size <= weights["tok_emb.weight"].shape[0]:
        return weights, []
    if config.tie_embeddings:
        weights = {k: v for k, v in weights.items() if k != TIED_KEY}  # the embedding's own matrix, grown once
    weights = {k: v.dequantized() if isinstance(v, Blocks) and k in VOCABULARY_TENSORS else v for k, v in weights.items()}  # they train whole, in f32
    return grow_vocabulary(weights, config.vocab_size), vocabulary_modules(config)


def check_token_ids(batch, task: str, vocab_size: int, data: Path) -> None:
    """Ids past the vocabulary would fail deep inside the embedding; shards that hold them are damaged."""
    keys = ("ids", "decoder_ids") if task == "classify" else ("ids", "decoder_ids", "labels")
    for key in keys:
        tensor = batch.tensors.get(key)
        if tensor is not None and tensor.numel() and int(tensor.max()) >= vocab_size:
            raise TfcliError(
                f"{data} holds the token id {int(tensor.max())}, outside the model's vocabulary of {vocab_size:,}",
                hint="the data is damaged or from another tokenizer; encode it again with `tfcli tokenize encode`",
            )


def build_source(job: TrainingJob, world: World):
    cfg, tok = job.config, job.tokenizer
    per_rank, block = cfg.batch_size, job.block_size
    if isinstance(job, ChatJob):
        pad = tok.special_ids.get("pad", tok.special_ids.get("eos", 0))
        return ChatSource(cfg.task, job.train_set, job.val_set, per_rank, cfg.seed, pad_id=pad, eos_id=pad, accum=cfg.grad_accum)
    if isinstance(job, LabeledJob):
        return d.LabeledSource(
            cfg.task, job.train_set, job.val_set, per_rank, cfg.seed, pad_id=tok.require("pad"), eos_id=tok.special_ids.get("eos", 0), accum=cfg.grad_accum
        )
    train, val = open_shard(job.data, "train"), open_shard(job.data, "val")
    if cfg.task == "lm":
        return d.LMSource(train, val, block, per_rank, cfg.seed)
    if cfg.task == "mlm":
        return d.MLMSource(
            train, val, block, per_rank, cfg.seed, cls_id=tok.require("cls"), mask_id=tok.require("mask"), vocab=tok.vocab_size, prob=cfg.mask_prob
        )
    return d.DenoiseSource(
        train,
        val,
        block,
        per_rank,
        cfg.seed,
        pad_id=tok.require("pad"),
        mask_id=tok.require("mask"),
        eos_id=tok.require("eos"),
        density=cfg.noise_density,
        mean_span=cfg.mean_span,
    )


def token_byte_lengths(tokenizer: TextTokenizer, vocab_size: int) -> torch.Tensor:
    """Bytes of text each of the model's `vocab_size` token ids stands for, as the tokenizer's decoder writes it
    (special tokens count 0), for bits per byte."""
    lengths = torch.zeros(vocab_size, dtype=torch.long)
    known = text_byte_lengths(tokenizer)[:vocab_size]
    lengths[: len(known)] = torch.tensor(known, dtype=torch.long)
    lengths[[i for i in set(tokenizer.special_ids.values()) if i < len(lengths)]] = 0
    return lengths


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where a run starts: step 0, or (--resume) the counters of the checkpoint it continues, the metrics window
    that checkpoint was in the middle of, and the folder of its trainer state (the optimizer's tensors)."""

    step: int = 0
    tokens_seen: int = 0
    elapsed: float = 0.0  # seconds trained before this process
    best_val: float | None = None  # the lowest validation loss up to the checkpoint, at best_step
    best_step: int | None = None
    evals_since_best: int = 0  # evaluations since then (--early-stop)
    best_saved: float | None = None  # what best/ holds: best_val, or lower if best/ was saved after the checkpoint
    window_loss: float = 0.0
    window_count: int = 0
    folder: Path | None = None


def resume_point(job: TrainingJob, world: World) -> ResumePoint:
    """On --resume: the saved trainer state, checked against this run's data, tokenizer and world size."""
    if not job.resume:
        return ResumePoint()
    folder, saved = find_trainer_state(job.run_dir)
    if saved.world_size != world.size:  # the step number is the run's whole data position: each rank's slice of it
        how = (
            "in one process, without torchrun"
            if saved.world_size == 1
            else f"on {saved.world_size} processes in all (torchrun --nproc-per-node {saved.world_size} on one machine)"
        )
        raise TfcliError(
            f"cannot resume: the world size was {saved.world_size}, now {world.size}",
            hint=f"resume {how}: a step's data is --batch-size rows per process, so another count would not continue the run exactly",
        )
    val = f" and {job.val_data}" if job.val_data is not None else ""
    for before, now, problem in (
        (saved.data_fingerprint, job.data_fingerprint, f"{job.data}{val} is not the data the run was trained on (its contents differ)"),
        (saved.tokenizer_sha256, job.tokenizer.sha256, "the tokenizer is not the one the run was trained with"),
    ):
        if before != now:
            raise TfcliError(f"cannot resume: {problem}", hint="resume with the data and tokenizer the run was started with")
    best_saved = lowest(saved.best_val_loss, best_saved_val_loss(job.run_dir))  # best/ may be newer than the checkpoint
    return ResumePoint(
        saved.step,
        saved.tokens_seen,
        saved.elapsed_seconds,
        saved.best_val_loss,
        saved.best_step,
        saved.evals_since_best,
        best_saved,
        saved.window_loss,
        saved.window_count,
        folder,
    )


def check_world(config: TrainConfig, world: World) -> None:
    if config.fsdp and not world.enabled:
        raise TfcliError(
            "--fsdp shards the model across the processes torchrun starts; this is one process",
            hint="launch with torchrun --nproc-per-node N -m tfcli train ... --fsdp, or drop --fsdp",
        )


def optimizer_for(model, config: TrainConfig, device: torch.device, names: dict[int, str], start: ResumePoint, fsdp: bool) -> Optimizer:
    """AdamW over the model's trainable parameters (or Muon and AdamW: --optimizer muon), with the saved state
    loaded on --resume."""
    optimizer = make_optimizer(model, config, device)
    if start.folder is not None:
        saved_tensors = read_optimizer_tensors(start.folder / OPTIMIZER_FILE)
        if fsdp:
            sharding.load_full_optimizer_tensors(model, optimizer, saved_tensors)
        else:
            load_optimizer_tensors(optimizer, saved_tensors, names)
    return optimizer


def wrapped(model, config: TrainConfig, world: World, device: torch.device, fsdp: bool):
    """(the DDP wrapper or None, what the forward pass runs: DDP, torch.compile of it, or the model)."""
    runner, ddp = model, None
    if world.enabled and not fsdp:
        unused = config.task == "classify" or model.config.n_classes > 0
        # the buffers (position tables) are the same on every rank: no syncing before each forward
        no_sync = (
            {"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters else {"broadcast_buffers": False}
        )  # the older name
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, block_buffers(model) + frozen_parameters(model))
        ddp = runner = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None, find_unused_parameters=unused, **no_sync)
    if config.compile:
        runner = torch.compile(runner)
    return ddp, runner


def block_buffers(model) -> list[str]:
    """The names of a quantized parent's block bytes (QLoRA), which DDP leaves alone: every rank read them from the
    same file, they never change, and broadcasting them from rank 0 as DDP starts would send the whole parent.
    Example: ["tok_emb.blocks", "lm_head.blocks", "decoder.blocks.0.attn.qkv.base_layer.blocks", ...]"""
    layers = model.named_modules(remove_duplicate=False)
    return [f"{name}.blocks" for name, module in layers if isinstance(module, (QuantLinear, QuantEmbedding))]


def frozen_parameters(model) -> list[str]:
    """The names of the parameters that do not train (a LoRA parent's weights, --freeze), which DDP leaves alone
    too: every rank built them alike (from the same file, or from the same seed), no gradient ever changes them,
    and broadcasting them from rank 0 as DDP starts would send the whole parent (500 MB for GPT-2 small).
    Example: ["tok_emb.weight", "decoder.blocks.0.attn.qkv.base_layer.weight", ...]"""
    return [name for name, parameter in model.named_parameters() if not parameter.requires_grad]


@dataclasses.dataclass
class Throughput:
    """Tokens per optimizer step and the matmul FLOPs they cost, beside the machine's peak (0: not timed, on
    the ranks that do not log)."""

    tokens_per_step: int
    flops_per_step: float
    peak: float

    def utilisation(self, rate: float) -> float:
        """MFU at `rate` tokens/s."""
        achieved = rate / max(self.tokens_per_step, 1) * self.flops_per_step
        return achieved / self.peak if self.peak else 0.0


def throughput(job: TrainingJob, world: World, device: torch.device, bf16: bool, tokens_per_row: int) -> Throughput:
    cfg = job.config
    tokens_per_step = cfg.batch_size * world.size * cfg.grad_accum * tokens_per_row
    dtype = torch.bfloat16 if bf16 else torch.float32
    peak = peak_matmul_flops(device, dtype) if world.is_main else 0.0
    return Throughput(tokens_per_step, training_flops_per_token(job.model_config, tokens_per_row) * tokens_per_step, peak)


@dataclasses.dataclass
class MetricsWindow:
    """What the metrics record being gathered sums: the loss and target count (this rank's), the tokens, and the
    seconds its steps took (evaluating, logging and saving between them not counted)."""

    loss: torch.Tensor
    count: int
    tokens: int = 0
    seconds: float = 0.0

    @classmethod
    def opened(cls, device: torch.device, start: ResumePoint | None = None) -> MetricsWindow:
        """An empty window, or the one a checkpoint was in the middle of."""
        if start is None:
            return cls(torch.zeros((), device=device), 0)
        return cls(torch.tensor(start.window_loss, dtype=torch.float32, device=device), start.window_count)

    def rate(self, since: MetricsWindow | None = None) -> float:
        """Tokens per second over this window's steps, and over `since`'s (the window before) too where given.
        Example: 4,096 tokens in 0.5 s -> 8192.0"""
        tokens, seconds = self.tokens + (since.tokens if since else 0), self.seconds + (since.seconds if since else 0.0)
        return tokens / seconds if seconds > 0 else 0.0
