"""`tfcli train sae`: a sparse autoencoder trained on one hook point of a run, its activations streamed
from the model into a shuffled buffer of bounded size (never a dump of every activation to disk).

The data is a pure function of (seed, step): refill r of the buffer runs the model on windows drawn by a
generator seeded with (seed, r), shuffles the activations with it, and step s reads batch s % per_refill of
refill s // per_refill. A resumed run rebuilds its buffer that way, so it continues exactly where the
checkpoint was. The inputs are scaled by a power of two that brings their mean norm near sqrt(d_in) (exact
both ways, folded into the saved weights). The decoder's rows are kept unit norm in that space; dead
features (none fired for --dead-after vectors) are revived by TopK's auxiliary loss (AuxK: the top dead
latents reconstruct the live ones' residual) or, for relu and jumprelu, by resampling (their encoder and
decoder rows set towards inputs the SAE reconstructs worst).

RUN/ holds SAELens's cfg.json and sae_weights.safetensors (the folded weights), sae_training.json (these
settings), metrics.jsonl and trainer/ (Adam's state, the dead-feature counters, state.json), saved as
`tfcli.train.state` saves a model's: staged, then swapped in, so a kill -9 at any point leaves a checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tfcli.data.shards import load_shard_meta, open_shard
from tfcli.errors import TfcliError
from tfcli.fsutil import atomic_write_json, atomic_write_text, commit_staged, staging
from tfcli.loader import load_run
from tfcli.sae.files import CFG_FILE, WEIGHTS_FILE, check_sae_output, load_sae_for, sae_config, stage_sae
from tfcli.sae.metrics import ce_loss_recovered, reconstruction_stats
from tfcli.sae.model import ARCH_NAMES, SparseAutoencoder, refuse_what_memory_cannot_hold
from tfcli.sae.points import activations, hook_widths, resolve_hook
from tfcli.schema import JsonRecord
from tfcli.tensorfile import read_tensors
from tfcli.train.evaluate import _text_tokens
from tfcli.train.state import (
    METRICS_FILE,
    OPTIMIZER_FILE,
    TRAINER_FORMAT,
    MetricsWriter,
    TrainerState,
    commit_trainer_state,
    find_trainer_state,
    read_metrics,
    read_optimizer_tensors,
    stage_trainer_state,
    truncate_metrics,
)

SETTINGS_FILE = "sae_training.json"
FORWARD_WINDOWS = 16  # windows per forward pass while filling the buffer


@dataclasses.dataclass
class SaeTrainSettings(JsonRecord):
    """RUN/sae_training.json: what the SAE was trained on and how (a resumed run takes them from here)."""

    run: str  # the model's run directory
    hook: str  # the hook point, TransformerLens's name
    data: str  # a shard folder (its train split) or a text file
    arch: str = "topk"  # topk, relu or jumprelu
    width: int = 0  # d_sae; 0: expansion * d_in
    expansion: int = 8
    k: int = 32  # topk: features kept per vector
    lr: float = 4e-4
    batch_size: int = 1024  # vectors per step
    max_tokens: int = 2_000_000  # vectors trained on, in all
    time_budget: float = 0.0  # seconds; 0: none
    context: int = 128  # tokens per window the model reads
    buffer: int = 65_536  # vectors in the shuffled buffer (memory: buffer * d_in * 4 bytes)
    sparsity: float = 1.0  # relu: the L1 penalty's coefficient; jumprelu: the L0 penalty's
    aux_coefficient: float = 1.0 / 32  # topk: AuxK's weight
    dead_after: int = 200_000  # vectors without a firing before a feature counts as dead
    log_every: int = 50  # steps between metrics records
    save_every: int = 500  # steps between checkpoints; the end always saves
    eval_windows: int = 32  # held-out windows for CE loss recovered, at every save
    seed: int = 0
    device: str = "cpu"


@dataclasses.dataclass
class SaeProgress:
    """One event of a training run, for the CLI to render: kind is start, log, saved or done."""

    kind: str
    record: dict[str, Any]


def _check(s: SaeTrainSettings) -> None:
    if s.arch not in ARCH_NAMES:
        raise TfcliError(f"--arch must be topk, relu or jumprelu, not {s.arch!r}")
    for name in ("batch_size", "max_tokens", "context", "buffer", "log_every", "dead_after", "eval_windows", "expansion"):
        if getattr(s, name) < 1:
            raise TfcliError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(s, name)}")
    if s.width < 0 or s.save_every < 0 or s.time_budget < 0:
        raise TfcliError("--width, --save-every and --time-budget cannot be negative")
    if not (s.lr > 0 and math.isfinite(s.lr)):
        raise TfcliError(f"--lr must be a positive number, not {s.lr}")
    if s.buffer < s.batch_size:
        raise TfcliError(f"--buffer ({s.buffer}) must hold at least one batch (--batch-size {s.batch_size})")


class ActivationBuffer:
    """The activations at one hook point of windows drawn from `tokens`, refilled whole and shuffled; batch
    s is a pure function of (seed, s). Memory: `size` vectors of the hook's width."""

    def __init__(self, model, hook: str, tokens: np.ndarray, settings: SaeTrainSettings, scale: float = 1.0) -> None:
        self.model, self.hook, self.tokens, self.s, self.scale = model, hook, tokens, settings, scale
        self.windows = max(1, settings.buffer // settings.context)
        self.per_refill = self.windows * settings.context // settings.batch_size
        self.refill_index, self.vectors = -1, None

    def draw(self, refill: int, windows: int, extra: int = 0) -> torch.Tensor:
        """(windows, context + extra) token ids at places drawn by the generator of (seed, refill)."""
        g = torch.Generator().manual_seed(self.s.seed * 1_000_003 + refill)
        length = self.s.context + extra
        starts = torch.randint(0, len(self.tokens) - length + 1, (windows,), generator=g).tolist()
        return torch.from_numpy(np.stack([np.asarray(self.tokens[i : i + length], dtype=np.int64) for i in starts]))

    def read(self, ids: torch.Tensor) -> torch.Tensor:
        """(N, T) ids -> (N * T, width) activations at the hook, scaled."""
        device = next(self.model.parameters()).device
        parts = [activations(self.model, self.hook, ids[i : i + FORWARD_WINDOWS].to(device)) for i in range(0, len(ids), FORWARD_WINDOWS)]
        return torch.cat(parts).flatten(0, 1).float() * self.scale

    def batch(self, step: int) -> torch.Tensor:
        refill, offset = divmod(step, self.per_refill)
        if refill != self.refill_index:
            self.vectors = None  # the old buffer goes before the new one is made: memory stays one buffer
            vectors = self.read(self.draw(refill, self.windows))
            g = torch.Generator().manual_seed(self.s.seed * 1_000_003 + refill)
            self.vectors, self.refill_index = vectors[torch.randperm(len(vectors), generator=g)], refill
        B = self.s.batch_size
        return self.vectors[offset * B : (offset + 1) * B]


def input_scale(buffer: ActivationBuffer, width: int) -> float:
    """The power of two that brings the activations' mean norm nearest sqrt(width), from 32 windows drawn
    apart from training's."""
    x = buffer.read(buffer.draw(-1, 32))
    mean_norm = float(x.norm(dim=-1).mean())
    if not math.isfinite(mean_norm) or mean_norm == 0:
        raise TfcliError(f"the activations at {buffer.hook} are all zero or not finite", hint="pick another hook point")
    return 2.0 ** round(math.log2(math.sqrt(width) / mean_norm))


def tokens_of(checkpoint, data: Path, split: str) -> np.ndarray:
    """The token ids to read: a shard folder's split, or a text file's (train: its first 90%, val: the rest)."""
    data = Path(data)
    if data.is_dir() and (data / "meta.json").is_file():
        meta = load_shard_meta(data)
        if meta.tokenizer_sha256 != checkpoint.tokenizer.sha256:
            raise TfcliError(f"the shards in {data} were encoded with another tokenizer than the run's", hint="encode the text with the run's tokenizer.json")
        tokens = open_shard(data, split)
        if len(tokens) == 0:
            tokens = open_shard(data, "train" if split == "val" else "val")
        return tokens
    if not data.is_file():
        raise TfcliError(f"{data} does not exist", hint="pass a shard folder or a text file as --data")
    tokens = np.asarray(_text_tokens(data, checkpoint.tokenizer))
    cut = int(len(tokens) * 0.9)
    return tokens[:cut] if split == "train" else tokens[cut:]


class _JumpReLU(torch.autograd.Function):
    """pre * (pre > threshold), with the straight-through estimate of the threshold's gradient (a rectangle
    of width `bandwidth` around it), as in Rajamanoharan et al. (2024) and SAELens."""

    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return pre * (pre > threshold)

    @staticmethod
    def backward(ctx, grad):
        pre, threshold = ctx.saved_tensors
        near = ((pre - threshold).abs() < ctx.bandwidth / 2).to(pre)
        return (pre > threshold) * grad, (-(threshold / ctx.bandwidth) * near * grad).sum(0), None


class _Step(torch.autograd.Function):
    """1 where pre > threshold (the L0 penalty), the threshold's gradient estimated as above."""

    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return (pre > threshold).to(pre)

    @staticmethod
    def backward(ctx, grad):
        pre, threshold = ctx.saved_tensors
        near = ((pre - threshold).abs() < ctx.bandwidth / 2).to(pre)
        return None, (-(1.0 / ctx.bandwidth) * near * grad).sum(0), None


BANDWIDTH = 0.05


def sae_loss(sae: SparseAutoencoder, x: torch.Tensor, dead: torch.Tensor, s: SaeTrainSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, features, reconstruction) of a batch x (B, d_in): the squared error summed over d_in, meaned over
    the batch, plus the architecture's sparsity term (L1 for relu, L0 for jumprelu) or AuxK for topk."""
    pre = sae.pre_activations(x)  # (B, d_sae)
    if sae.architecture == "jumprelu":
        features = _JumpReLU.apply(pre, sae.threshold, BANDWIDTH)
    else:
        features = sae.activate(pre)
    recon = sae.decode(features)
    loss = (recon - x).pow(2).sum(-1).mean()
    if sae.architecture == "standard":
        loss = loss + s.sparsity * (features * sae.W_dec.norm(dim=1)).sum(-1).mean()
    elif sae.architecture == "jumprelu":
        loss = loss + s.sparsity * _Step.apply(pre, sae.threshold, BANDWIDTH).sum(-1).mean()
    elif (n_dead := int(dead.sum())) > 0:  # AuxK: the top dead latents reconstruct the live ones' residual
        k_aux = min(x.shape[-1] // 2, n_dead)
        residual = (x - recon).detach()
        values, indices = pre.masked_fill(~dead, -torch.inf).topk(k_aux, dim=-1, sorted=False)
        aux = torch.zeros_like(pre).scatter_(-1, indices, values.relu()) @ sae.W_dec
        scale = min(n_dead / (x.shape[-1] // 2), 1.0)
        loss = loss + s.aux_coefficient * scale * (aux - residual).pow(2).sum(-1).mean()
    return loss, features.detach(), recon.detach()


@torch.no_grad()
def _unit_decoder(sae: SparseAutoencoder) -> None:
    sae.W_dec.div_(sae.W_dec.norm(dim=1, keepdim=True).clamp_min(1e-8))


@torch.no_grad()
def _resample(sae: SparseAutoencoder, dead: torch.Tensor, x: torch.Tensor, recon: torch.Tensor, optimizer, g: torch.Generator) -> int:
    """relu / jumprelu: each dead feature's decoder row set to an input the SAE reconstructs worst (drawn in
    proportion to the squared error), its encoder column to that direction, small; Adam's moments for them
    reset. Returns how many were resampled."""
    idx = dead.nonzero().flatten().to(x.device)
    if not len(idx):
        return 0
    error = (x - recon).pow(2).sum(-1).double().cpu()  # drawn on the CPU, where the generator is
    picks = torch.multinomial(error / error.sum(), len(idx), replacement=True, generator=g).to(x.device)
    directions = x[picks] - sae.b_dec
    directions = directions / directions.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    sae.W_dec[idx] = directions
    sae.W_enc[:, idx] = directions.T * 0.2
    sae.b_enc[idx] = 0
    for p in (sae.W_enc, sae.W_dec, sae.b_enc):
        state = optimizer.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                (state[key][:, idx] if p is sae.W_enc else state[key][idx]).zero_()
    return len(idx)


def folded(sae: SparseAutoencoder, scale: float) -> dict[str, torch.Tensor]:
    """The weights for raw (unscaled) activations: the scale folded in, exactly (a power of two)."""
    tensors = {name: p.detach().clone() for name, p in sae.named_parameters()}
    tensors["W_enc"] *= scale
    tensors["b_dec"] /= scale
    tensors["W_dec"] /= scale
    return tensors


def _as_sae(tensors: dict[str, torch.Tensor], like: SparseAutoencoder) -> SparseAutoencoder:
    sae = SparseAutoencoder(like.d_in, like.d_sae, like.architecture, k=like.k)  # type: ignore[arg-type]
    with torch.no_grad():
        for name, tensor in tensors.items():
            getattr(sae, name).copy_(tensor)
    return sae.eval().to(like.W_dec.device)


def new_optimizer(sae: SparseAutoencoder, s: SaeTrainSettings) -> torch.optim.Adam:
    """Adam at a constant rate, SAELens's betas."""
    return torch.optim.Adam(sae.parameters(), lr=s.lr, betas=(0.9, 0.999), foreach=False)


def train_step(sae: SparseAutoencoder, optimizer, x: torch.Tensor, since_fired: torch.Tensor, s: SaeTrainSettings, step: int):
    """One update on a batch x (B, d_in), already scaled: the loss, the decoder rows' gradient along
    themselves removed and their norm put back to 1, the dead-feature counters advanced, resampling where
    due (relu, jumprelu). Returns (loss, features, reconstruction, since_fired, resampled)."""
    dead = since_fired >= s.dead_after
    loss, features, recon = sae_loss(sae, x, dead.to(x.device), s)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    with torch.no_grad():  # the gradient along each decoder row would only change its norm
        sae.W_dec.grad -= (sae.W_dec.grad * sae.W_dec).sum(1, keepdim=True) * sae.W_dec
    optimizer.step()
    _unit_decoder(sae)
    if sae.architecture == "jumprelu":
        with torch.no_grad():
            sae.threshold.clamp_(min=1e-6)
    fired = (features > 0).sum(0).cpu()
    since_fired = torch.where(fired > 0, 0, since_fired + len(x))
    resampled = 0
    if sae.architecture != "topk" and (step + 1) % max(1, s.dead_after // s.batch_size) == 0:
        resampled = _resample(sae, since_fired >= s.dead_after, x, recon, optimizer, torch.Generator().manual_seed(s.seed * 7919 + step))
        since_fired[since_fired >= s.dead_after] = 0
    return loss, features, recon, since_fired, resampled


WINDOW_KEYS = ("vectors", "steps", "l0", "explained_variance", "mse", "loss", "resampled")


def train_sae(settings: SaeTrainSettings, output: Path, *, resume: bool = False) -> Iterator[SaeProgress]:
    """Train (or, with `resume`, continue) the SAE `settings` describe into `output`; yields progress."""
    output = Path(output)
    if resume:
        if not (output / SETTINGS_FILE).is_file():
            raise TfcliError(f"{output} holds no SAE run to resume ({SETTINGS_FILE} is missing)", hint="start it without --resume")
        given = settings
        settings = SaeTrainSettings.load(output / SETTINGS_FILE)
        settings = dataclasses.replace(settings, max_tokens=given.max_tokens, time_budget=given.time_budget)
    elif (output / CFG_FILE).exists() or (output / SETTINGS_FILE).exists():
        raise TfcliError(f"{output} already holds an SAE", hint="continue it with --resume, or pass another -o")
    else:
        check_sae_output(output)
    _check(settings)
    s = settings
    checkpoint = load_run(s.run, "evaluate", s.device)
    model = checkpoint.model
    if checkpoint.config.model.arch != "decoder":
        raise TfcliError(f"tfcli train sae works on decoder runs; {s.run} is {checkpoint.config.model.arch}")
    model.requires_grad_(False)
    widths = hook_widths(model)
    hook = resolve_hook(model, s.hook, widths)
    d_in = widths[hook]
    d_sae = s.width or s.expansion * d_in
    refuse_what_memory_cannot_hold(d_in, d_sae, s.buffer, s.device)
    arch = ARCH_NAMES[s.arch]
    if arch == "topk" and not 1 <= s.k <= d_sae:
        raise TfcliError(f"--k must be between 1 and the width ({d_sae}), not {s.k}")
    s = dataclasses.replace(s, hook=hook, context=min(s.context, checkpoint.config.model.block_size - 1))
    train_tokens, held_out = tokens_of(checkpoint, Path(s.data), "train"), tokens_of(checkpoint, Path(s.data), "val")
    for name, tokens in (("training", train_tokens), ("held-out", held_out)):
        if len(tokens) < s.context + 2:
            raise TfcliError(f"{s.data} has {len(tokens)} {name} tokens, fewer than one window of {s.context + 2}", hint="pass more text")
    buffer = ActivationBuffer(model, hook, train_tokens, s)
    buffer.scale = scale = input_scale(buffer, d_in)
    eval_windows = ActivationBuffer(model, hook, held_out, s).draw(-2, s.eval_windows, extra=1).to(next(model.parameters()).device)

    torch.manual_seed(s.seed)
    sae = SparseAutoencoder(d_in, d_sae, arch, k=s.k if arch == "topk" else None).to(next(model.parameters()).device)  # type: ignore[arg-type]
    optimizer = new_optimizer(sae, s)
    since_fired = torch.zeros(d_sae, dtype=torch.long)
    window = torch.zeros(len(WINDOW_KEYS), dtype=torch.float64)
    fires = torch.zeros(d_sae, dtype=torch.float64)
    state = TrainerState(TRAINER_FORMAT, 0, 0, 0.0, 1, f"{s.data}:{s.seed}", checkpoint.tokenizer.sha256)
    output.mkdir(parents=True, exist_ok=True)
    if resume:
        folder, state = find_trainer_state(output, output / WEIGHTS_FILE)
        tensors = read_optimizer_tensors(folder / OPTIMIZER_FILE)
        weights = read_tensors(output / WEIGHTS_FILE, sae.shapes())
        with torch.no_grad():
            for name, tensor in weights.items():
                getattr(sae, name).copy_(tensor.to(sae.W_dec.device))
            sae.W_enc /= scale
            sae.b_dec *= scale
            sae.W_dec *= scale
        _load_optimizer(optimizer, sae, tensors)
        since_fired, window, fires = tensors["dead/since_fired"].long(), tensors["window/sums"].double(), tensors["window/fires"].double()
        _records_to_continue(output / METRICS_FILE, state.step, s)
    else:
        atomic_write_json(output / SETTINGS_FILE, s.to_json())
        (output / METRICS_FILE).unlink(missing_ok=True)
    config = sae_config(sae, hook, model_name=Path(s.run).name, context_size=s.context, tfcli_run=str(Path(s.run).resolve()))
    metrics = MetricsWriter(output / METRICS_FILE)

    logged = [-1]  # the step of the last metrics record

    def save() -> dict[str, Any]:
        saved = folded(sae, scale)
        ce = ce_loss_recovered(model, _as_sae(saved, sae), hook, eval_windows)
        trainer = {**_optimizer_tensors(optimizer, sae), "dead/since_fired": since_fired.clone(), "window/sums": window.clone(), "window/fires": fires.clone()}
        metrics.sync()
        with staging() as staged:
            weights = stage_sae(staged, output, sae, config, saved)
            stage_trainer_state(output, dataclasses.replace(state), trainer, weights)
            commit_staged(staged, then=lambda: commit_trainer_state(output))
        if logged[0] == state.step:
            metrics.amend(ce)
        return {"step": state.step, "tokens": state.tokens_seen, **ce}

    yield SaeProgress("start", {"hook": hook, "d_in": d_in, "d_sae": d_sae, "arch": s.arch, "scale": scale, "step": state.step, "resumed": resume})
    started = time.perf_counter() - state.elapsed_seconds
    try:
        while state.tokens_seen < s.max_tokens and not (s.time_budget and time.perf_counter() - started >= s.time_budget):
            x = buffer.batch(state.step).to(sae.W_dec.device)
            loss, features, recon, since_fired, resampled = train_step(sae, optimizer, x, since_fired, s, state.step)
            fires += (features > 0).sum(0).cpu()
            stats = reconstruction_stats(x, features, recon)
            window += torch.tensor(
                [len(x), 1, stats["l0"], stats["explained_variance"], stats["mse"] / scale**2, float(loss.detach()), resampled], dtype=torch.float64
            )
            state.step += 1
            state.tokens_seen += len(x)
            state.elapsed_seconds = time.perf_counter() - started
            if state.step % s.log_every == 0:
                record = _record(state, window, fires, since_fired, s)
                window.zero_()
                fires.zero_()
                metrics.write(record)
                logged[0] = state.step
                yield SaeProgress("log", record)
            if s.save_every and state.step % s.save_every == 0:
                yield SaeProgress("saved", save())
        if state.step % s.log_every:  # a last, partial record; its sums stay in the checkpoint for a resumed run
            record = _record(state, window, fires, since_fired, s)
            metrics.write(record)
            logged[0] = state.step
            yield SaeProgress("log", record)
        final = save()
        yield SaeProgress("done", {**final, "dead_fraction": float((since_fired >= s.dead_after).float().mean()), "output": str(output)})
    finally:
        metrics.close()


def _record(state: TrainerState, window: torch.Tensor, fires: torch.Tensor, since_fired: torch.Tensor, s: SaeTrainSettings) -> dict[str, Any]:
    sums = dict(zip(WINDOW_KEYS, window.tolist(), strict=True))
    steps = max(sums["steps"], 1)
    density = fires / max(sums["vectors"], 1)
    return {
        "step": state.step,
        "tokens": state.tokens_seen,
        "loss": sums["loss"] / steps,
        "mse": sums["mse"] / steps,
        "l0": sums["l0"] / steps,
        "explained_variance": sums["explained_variance"] / steps,
        "dead_fraction": float((since_fired >= s.dead_after).double().mean()),
        "dense_fraction": float((density > 0.1).double().mean()),
        "resampled": int(sums["resampled"]),
        "elapsed_seconds": round(state.elapsed_seconds, 3),
    }


def _records_to_continue(path: Path, step: int, s: SaeTrainSettings) -> None:
    """metrics.jsonl as an uninterrupted run would have it at `step`: a last, partial record goes, and the CE
    loss measured only because the run ended there."""
    truncate_metrics(path, step - (step % s.log_every > 0))
    records = read_metrics(path)
    if records and records[-1]["step"] == step and not (s.save_every and step % s.save_every == 0):
        records[-1] = {k: v for k, v in records[-1].items() if not k.startswith("ce_")}
        atomic_write_text(path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in records))


def _optimizer_tensors(optimizer, sae: SparseAutoencoder) -> dict[str, torch.Tensor]:
    names = {id(p): name for name, p in sae.named_parameters()}
    tensors = {}
    for p, values in optimizer.state.items():
        for key, value in values.items():
            tensors[f"adam/{names[id(p)]}/{key}"] = (value if torch.is_tensor(value) else torch.tensor(value)).detach().cpu().clone()
    return tensors


def _load_optimizer(optimizer, sae: SparseAutoencoder, tensors: dict[str, torch.Tensor]) -> None:
    for name, p in sae.named_parameters():
        values = {key.split("/")[-1]: t for key, t in tensors.items() if key.startswith(f"adam/{name}/")}
        if values:
            if set(values) != {"step", "exp_avg", "exp_avg_sq"} or values["exp_avg"].shape != p.shape:
                raise TfcliError(f"the trainer state in {OPTIMIZER_FILE} does not belong to this SAE", hint="start a new SAE run")
            optimizer.state[p] = {k: v.to(p.device) if k != "step" else v for k, v in values.items()}


def evaluate_sae(run: Path, sae_dir: Path, data: Path, *, windows: int = 64, context: int = 128, device: str = "cpu", seed: int = 0) -> dict[str, Any]:
    """`tfcli eval RUN --sae SAE`: the SAE's metrics on held-out windows of `data` (a shard folder's val split,
    or a text file's last 10%): L0, explained variance, MSE, the features that never fired there (dead) and
    those firing on more than 10% of tokens (dense), and CE loss recovered."""
    checkpoint = load_run(run, "evaluate", device)
    model = checkpoint.model
    sae, config = load_sae_for(Path(sae_dir), model, run)
    hook = resolve_hook(model, config.hook_name)
    context = min(context, checkpoint.config.model.block_size - 1)
    tokens = tokens_of(checkpoint, Path(data), "val")
    if len(tokens) < context + 2:
        raise TfcliError(f"{data} has {len(tokens)} held-out tokens, fewer than one window of {context + 2}", hint="pass more text")
    settings = SaeTrainSettings(run=str(run), hook=hook, data=str(data), context=context, seed=seed)
    reader = ActivationBuffer(model, hook, tokens, settings)
    ids = reader.draw(-2, windows, extra=1).to(next(model.parameters()).device)
    x = reader.read(ids[:, :-1])
    with torch.no_grad():
        features = sae.encode(x)
        recon = sae.decode(features)
    density = (features > 0).double().mean(0)
    result = {"run": str(run), "sae": str(sae_dir), "hook": hook, "d_sae": config.d_sae, "architecture": config.architecture, "tokens": len(x)}
    result |= reconstruction_stats(x, features, recon)
    result |= {"dead_fraction": float((density == 0).double().mean()), "dense_fraction": float((density > 0.1).double().mean())}
    return result | ce_loss_recovered(model, sae, hook, ids)
