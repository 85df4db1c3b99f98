"""The training settings (`TrainConfig`): a torch-free, JSON-serialisable dataclass, validated on creation.

A run's config.json records them (`checkpoint.py`); `train/command_line.py` makes them from a command line.
"""

from __future__ import annotations

import dataclasses

from tfcli.errors import TfcliError
from tfcli.schema import JsonRecord

TASKS = ("lm", "mlm", "denoise", "classify", "seq2seq", "chat", "instruct")
PRETRAIN_TASK = {"decoder": "lm", "encoder": "mlm", "encoder-decoder": "denoise"}
SCHEDULES = ("cosine", "linear", "constant", "wsd")
OPTIMIZERS = ("adamw", "muon")
# --resume with another max_steps: continue (the decay goes on from the rate the run had) | stretch (the schedule laid over
# the new length, as litgpt and nanoGPT recompute it; the rate may jump back up)
RESUME_SCHEDULES = ("continue", "stretch")
# --early-stop where the option is not given: on (this many evaluations) for a --time-budget run; the one-command
# text path sets it too (text_data.TEXT_DEFAULTS). Elsewhere a run trains to its end. Five, not three: on the sample
# stories (d_model 64, 2 layers, an evaluation every 50 steps) the validation loss went 3 evaluations without a new
# low at steps 1300-1400, then fell 3.4% more (0.9032 -> 0.8725 at step 1800) and never again (0.8810 at 2500, while
# the training loss fell 0.64 -> 0.57): 5 stops that run at step 2050 with best/ at 1800, 3 would stop it at 1400.
EARLY_STOP_DEFAULT = 5
DEVICES = ("auto", "cpu", "cuda", "mps")
PRECISIONS = ("auto", "fp32", "bf16")
FREEZE = ("none", "embeddings", "body")
# LoRA's target groups: the linear layers each wraps (tfcli/adapters/lora.py: TARGET_GROUPS)
LORA_TARGETS = ("qkv", "out", "mlp")
# Settings a resumed run may change: they do not alter what the finished steps computed.
RESUMABLE_CHANGES = (
    "max_steps",
    "time_budget",
    "eval_every",
    "eval_batches",
    "log_every",
    "save_every",
    "keep_every",
    "device",
    "compile",
    "fsdp",
    "decay_restart",
    "resume_schedule",
    "early_stop",
)


@dataclasses.dataclass
class TrainConfig(JsonRecord):
    task: str = "lm"  # lm (decoder) | mlm (encoder) | denoise (encoder-decoder on text) | classify | seq2seq | chat | instruct
    max_steps: int = 1000  # optimizer updates (ignored when time_budget is set)
    time_budget: float | None = None  # seconds of training; the schedule is laid over the budget
    batch_size: int = 16  # sequences per micro-batch, per process
    grad_accum: int = 1  # micro-batches per optimizer update
    block_size: int | None = None  # tokens per training window (default: the model's block size)
    optimizer: str = "adamw"  # adamw | muon (Muon on the blocks' weight matrices, AdamW on embeddings, heads, norms, biases)
    lr: float = 1e-3  # peak learning rate (AdamW's)
    muon_lr: float = 0.02  # optimizer muon: Muon's peak learning rate (the schedule scales it as it scales lr)
    muon_momentum: float = 0.95  # optimizer muon: Muon's momentum (Nesterov)
    muon_weight_decay: float = 0.01  # optimizer muon: Muon's decoupled weight decay (multiplied by its learning rate)
    min_lr_ratio: float = 0.1  # the schedule decays to lr * min_lr_ratio
    schedule: str = "cosine"  # cosine | linear | constant | wsd (warm-up, stable at the peak, linear decay over the last decay_fraction)
    decay_fraction: float = 0.2  # schedule wsd: the share of the run (of max_steps, or of the time budget) the decay takes
    warmup_steps: int | None = None  # linear warm-up (default: the first 5% of the run)
    decay_restart: list[float] | None = None  # [step, lr factor there]: set by --resume with a new max_steps; the decay goes on from that rate
    resume_schedule: str = "continue"  # --resume with another max_steps: continue (decay_restart) | stretch (the schedule laid over the new max_steps)
    early_stop: int | None = None  # stop after N evaluations without a lower val loss (0: never; default: 5 with time_budget or text --data, else 0)
    weight_decay: float = 0.1  # AdamW's decoupled decay, on matrices only (not norms, biases, embeddings)
    beta1: float = 0.9  # AdamW's first-moment decay
    beta2: float = 0.95  # AdamW's second-moment decay
    eps: float = 1e-8  # AdamW's epsilon
    grad_clip: float = 1.0  # clip the global gradient norm to this (0: no clipping)
    label_smoothing: float = 0.0  # cross-entropy label smoothing: this share of each target spread evenly over all classes (0: none)
    seed: int = 1337  # every random draw (data windows, masks, dropout) derives from (seed, step, rank)
    eval_every: int = 100  # steps between evaluations on the validation split (0: only at the end)
    eval_batches: int = 20  # batches per evaluation
    log_every: int = 10  # steps between records in metrics.jsonl
    save_every: int = 500  # steps between checkpoints (0: only at the end)
    keep_every: int = 0  # steps between kept weight snapshots, RUN/checkpoints/step-NNNNNNN (weights, config, tokenizer; 0: none)
    device: str = "auto"  # auto | cpu | cuda | mps
    precision: str = "auto"  # auto (bf16 autocast on a GPU that has it, else fp32) | fp32 | bf16
    compile: bool = False  # torch.compile the model
    fsdp: bool = False  # under torchrun: shard parameters, gradients and optimizer state across the processes
    mask_prob: float = 0.15  # mlm: fraction of tokens to predict (80% masked, 10% random, 10% kept)
    noise_density: float = 0.3  # denoise: fraction of source tokens inside masked spans
    mean_span: float = 3.0  # denoise: mean span length (each span becomes one mask token)
    val_fraction: float = 0.1  # labeled data without --val-data: the share held out for validation
    freeze: str = "none"  # finetune: none | embeddings | body (train only the new head)
    labels: list[str] | None = None  # classify: class names, index = class id (read from the data)
    lora_rank: int | None = None  # finetune: LoRA adapters of this rank on a frozen base (None: train the weights themselves)
    lora_alpha: float | None = None  # LoRA: the update is scaled by alpha / rank (default: alpha = 2 * rank)
    lora_dropout: float = 0.0  # LoRA: dropout on the adapters' input
    lora_targets: str = "qkv,out,mlp"  # LoRA: the groups of linear layers that get adapters, comma-separated

    def __post_init__(self) -> None:
        checks = [
            ("task", self.task in TASKS, f"one of {', '.join(TASKS)}"),
            ("schedule", self.schedule in SCHEDULES, f"one of {', '.join(SCHEDULES)}"),
            ("optimizer", self.optimizer in OPTIMIZERS, f"one of {', '.join(OPTIMIZERS)}"),
            ("resume_schedule", self.resume_schedule in RESUME_SCHEDULES, f"one of {', '.join(RESUME_SCHEDULES)}"),
            ("device", self.device in DEVICES, f"one of {', '.join(DEVICES)}"),
            ("precision", self.precision in PRECISIONS, f"one of {', '.join(PRECISIONS)}"),
            ("freeze", self.freeze in FREEZE, f"one of {', '.join(FREEZE)}"),
            ("max_steps", self.max_steps >= 1, "at least 1"),
            ("batch_size", self.batch_size >= 1, "at least 1"),
            ("grad_accum", self.grad_accum >= 1, "at least 1"),
            ("block_size", self.block_size is None or self.block_size >= 2, "at least 2"),
            ("lr", 0 < self.lr <= 10, "positive and at most 10"),
            ("muon_lr", 0 < self.muon_lr <= 10, "positive and at most 10"),
            ("muon_momentum", 0 <= self.muon_momentum < 1, "in [0, 1)"),
            ("muon_weight_decay", self.muon_weight_decay >= 0, "0 or more"),
            ("min_lr_ratio", 0 <= self.min_lr_ratio <= 1, "between 0 and 1"),
            ("decay_fraction", 0 <= self.decay_fraction <= 1, "between 0 and 1"),
            ("early_stop", self.early_stop is None or self.early_stop >= 0, "0 (never) or more"),
            ("warmup_steps", self.warmup_steps is None or self.warmup_steps >= 0, "0 or more"),
            ("weight_decay", self.weight_decay >= 0, "0 or more"),
            ("beta1", 0 <= self.beta1 < 1, "in [0, 1)"),
            ("beta2", 0 <= self.beta2 < 1, "in [0, 1)"),
            ("eps", self.eps > 0, "positive"),
            ("grad_clip", self.grad_clip >= 0, "0 or more"),
            ("label_smoothing", 0 <= self.label_smoothing < 1, "in [0, 1)"),
            ("time_budget", self.time_budget is None or self.time_budget > 0, "positive"),
            (
                "decay_restart",
                self.decay_restart is None or (len(self.decay_restart) == 2 and self.decay_restart[0] >= 0 and 0 <= self.decay_restart[1] <= 1),
                "[step, factor] with step 0 or more and factor in [0, 1]",
            ),
            ("eval_every", self.eval_every >= 0, "0 or more"),
            ("eval_batches", self.eval_batches >= 1, "at least 1"),
            ("log_every", self.log_every >= 1, "at least 1"),
            ("save_every", self.save_every >= 0, "0 or more"),
            ("keep_every", self.keep_every >= 0, "0 or more"),
            ("mask_prob", 0 < self.mask_prob < 1, "in (0, 1)"),
            ("noise_density", 0 < self.noise_density < 1, "in (0, 1)"),
            ("mean_span", self.mean_span >= 1, "at least 1"),
            ("val_fraction", 0 <= self.val_fraction < 1, "in [0, 1)"),
            ("lora_rank", self.lora_rank is None or self.lora_rank >= 1, "at least 1"),
            ("lora_alpha", self.lora_alpha is None or self.lora_alpha > 0, "positive"),
            ("lora_dropout", 0 <= self.lora_dropout < 1, "in [0, 1)"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise TfcliError(f"training setting {name} must be {expected}, not {getattr(self, name)!r}")
        if self.optimizer == "muon" and self.fsdp:
            raise TfcliError(
                "--optimizer muon does not go with --fsdp: Muon orthogonalizes each weight matrix whole, and under FSDP a process holds only a shard of it",
                hint="drop --fsdp (data-parallel: each process holds whole matrices), or use --optimizer adamw",
            )
        groups = self.lora_groups
        unknown = [g for g in groups if g not in LORA_TARGETS]
        if unknown or not groups:
            what = f"names an unknown group {unknown[0]!r}" if unknown else "names no group"
            raise TfcliError(f"training setting lora_targets {what}", hint=f"the groups are {', '.join(LORA_TARGETS)} (comma-separated)")

    @property
    def lora_groups(self) -> tuple[str, ...]:
        """lora_targets as a tuple. Example: "qkv, mlp" -> ("qkv", "mlp")"""
        return tuple(dict.fromkeys(g.strip() for g in self.lora_targets.split(",") if g.strip()))

    @property
    def patience(self) -> int:
        """Evaluations without a lower validation loss before the run stops (0: never): early_stop, else
        EARLY_STOP_DEFAULT for a time budget. Example: TrainConfig(time_budget=60).patience -> 5; TrainConfig().patience -> 0"""
        if self.early_stop is not None:
            return self.early_stop
        return EARLY_STOP_DEFAULT if self.time_budget is not None else 0

    @property
    def resolved_lora_alpha(self) -> float:
        """alpha: given, else 2 * rank (the update is scaled by alpha / rank)."""
        return self.lora_alpha if self.lora_alpha is not None else 2.0 * (self.lora_rank or 0)
