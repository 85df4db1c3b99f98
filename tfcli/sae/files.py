"""An SAE's files, in SAELens's on-disk layout, so `sae_lens.SAE.load_from_disk` reads tfcli's and tfcli reads
SAELens's: cfg.json (d_in, d_sae, architecture, metadata.hook_name in TransformerLens's names, ...) and
sae_weights.safetensors (W_enc, b_enc, W_dec, b_dec, and threshold for jumprelu). Written atomically (both
files staged, then renamed together); read with every check first: keys, types, shapes, finite values, and
that the SAE fits the run it is used on (its hook exists there and gives vectors of width d_in), with a note where
it was trained on another run."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import save_file
from torch import nn

from tfcli.errors import TfcliError
from tfcli.fsutil import artifact_kind, commit_staged, stage_json, stage_written, staging
from tfcli.sae.model import Architecture, SparseAutoencoder
from tfcli.sae.points import hook_widths, resolve_hook
from tfcli.schema import JsonRecord
from tfcli.tensorfile import read_tensors

CFG_FILE = "cfg.json"  # SAELens's names (sae_lens.constants)
WEIGHTS_FILE = "sae_weights.safetensors"
# what `tfcli train sae` writes into its folder (tfcli.train.sae: settings, metrics, trainer state as tfcli.train.state names it)
SAE_RUN_FILES = {CFG_FILE, WEIGHTS_FILE, "sae_training.json", "metrics.jsonl", "trainer", "trainer.next", "trainer.prev"}
RUN_KEY = "tfcli_run"  # metadata: the run `tfcli train sae` trained the SAE on (SAELens's and others' SAEs have none)

_log = logging.getLogger("tfcli.loader.sae")  # a child of the loader's logger, whose notes the command line prints dim


def check_sae_output(output: Path) -> None:
    """Before an SAE is trained into OUTPUT: it is new, empty or an SAE's own folder (a stopped start, or --resume's),
    never a run directory, a tokenizer or shard folder or a folder of other files, whose metrics.jsonl and trainer/
    the SAE's would replace."""
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise TfcliError(f"-o {output} is a file, not a folder", hint="pass a new or empty folder with -o")
    if not output.is_dir():
        return
    kind = artifact_kind(output)
    if kind is not None:
        raise TfcliError(f"{output} is {kind}; the SAE would write over its files", hint="pass a new or empty folder with -o (the default is RUN/saes/HOOK)")
    foreign = sorted(p.name for p in output.iterdir() if not p.name.startswith(".") and p.name not in SAE_RUN_FILES)
    if foreign:
        raise TfcliError(f"{output} holds files that are not an SAE's ({foreign[0]!r}); the SAE would mix with them", hint="pass a new or empty folder with -o")


@dataclasses.dataclass
class SaeConfig(JsonRecord):
    """cfg.json as SAELens (6.x) writes an inference SAE's: unknown keys are refused, as in every tfcli record."""

    d_in: int
    d_sae: int
    architecture: Architecture
    metadata: dict[str, Any]  # SAELens's free-form record; hook_name (TransformerLens's name) is required here
    dtype: str = "float32"
    device: str = "cpu"
    apply_b_dec_to_input: bool = True
    normalize_activations: Literal["none"] = "none"  # tfcli folds its input scaling into the weights
    reshape_activations: Literal["none", "hook_z"] = "none"
    k: int | None = None  # topk only
    rescale_acts_by_decoder_norm: bool = False  # topk only: features scaled as if the decoder rows had unit norm

    def __post_init__(self) -> None:
        for name in ("d_in", "d_sae"):
            if getattr(self, name) < 1:
                raise TfcliError(f"{CFG_FILE}: {name} is {getattr(self, name)}, not a positive width")
        hook = self.metadata.get("hook_name")
        if not isinstance(hook, str) or not hook:
            raise TfcliError(f"{CFG_FILE} has no metadata.hook_name", hint="an SAE names the hook point it reads (TransformerLens's name)")
        if self.architecture == "topk" and (self.k is None or not 1 <= self.k <= self.d_sae):
            raise TfcliError(f"{CFG_FILE}: a topk SAE needs k between 1 and d_sae ({self.d_sae}), not {self.k}")
        if self.rescale_acts_by_decoder_norm and self.architecture != "topk":
            raise TfcliError(f"{CFG_FILE}: rescale_acts_by_decoder_norm goes with topk only, not {self.architecture}")
        if self.dtype not in ("float32", "float16", "bfloat16", "float64"):
            raise TfcliError(f"{CFG_FILE}: dtype {self.dtype!r} is not a floating-point type")

    def to_json(self) -> dict[str, Any]:
        record = super().to_json()
        if self.architecture != "topk":  # as SAELens writes the other architectures' configs
            del record["k"], record["rescale_acts_by_decoder_norm"]
        return record

    @property
    def hook_name(self) -> str:
        return self.metadata["hook_name"]


def sae_config(sae: SparseAutoencoder, hook_name: str, **metadata: Any) -> SaeConfig:
    """The cfg.json record of `sae`, reading `hook_name` (TransformerLens's name)."""
    return SaeConfig(
        d_in=sae.d_in,
        d_sae=sae.d_sae,
        architecture=sae.architecture,  # type: ignore[arg-type]
        metadata={"hook_name": hook_name, **metadata},
        apply_b_dec_to_input=sae.apply_b_dec_to_input,
        reshape_activations="hook_z" if hook_name.endswith("hook_z") else "none",
        k=sae.k,
        rescale_acts_by_decoder_norm=sae.rescale_acts_by_decoder_norm,
    )


def stage_sae(staged: list[tuple[Path, Path]], folder: Path, sae: SparseAutoencoder, config: SaeConfig, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """Stage the SAE's two files in `folder` (for `commit_staged`); returns the staged weights' temp path.
    `tensors`: the weights to write, if not the SAE's own."""
    tensors = tensors if tensors is not None else {name: p.detach() for name, p in sae.named_parameters()}
    tensors = {name: tensors[name].float().contiguous().cpu() for name in sae.shapes()}
    weights = stage_written(folder / WEIGHTS_FILE, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    staged.append((weights, folder / WEIGHTS_FILE))
    staged.append((stage_json(folder / CFG_FILE, config.to_json()), folder / CFG_FILE))
    return weights


def save_sae(folder: Path, sae: SparseAutoencoder, config: SaeConfig) -> None:
    """Write the SAE to `folder` (created), both files replaced together or not at all."""
    folder.mkdir(parents=True, exist_ok=True)
    with staging() as staged:
        stage_sae(staged, folder, sae, config)
        commit_staged(staged)


def read_sae_config(folder: Path) -> SaeConfig:
    folder = Path(folder)
    if not (folder / CFG_FILE).is_file():
        what = "does not exist" if not folder.exists() else f"has no {CFG_FILE}"
        raise TfcliError(f"{folder} {what}", hint="pass an SAE folder (cfg.json and sae_weights.safetensors), as `tfcli train sae` writes")
    return SaeConfig.load(folder / CFG_FILE)


def load_sae(folder: Path) -> tuple[SparseAutoencoder, SaeConfig]:
    """The SAE in `folder` and its config, every tensor checked (names, shapes, finite) before it is used."""
    folder = Path(folder)
    config = read_sae_config(folder)
    sae = SparseAutoencoder(
        config.d_in, config.d_sae, config.architecture, k=config.k, apply_b_dec_to_input=config.apply_b_dec_to_input,
        rescale_acts_by_decoder_norm=config.rescale_acts_by_decoder_norm,
    )  # fmt: skip
    if not (folder / WEIGHTS_FILE).is_file():
        raise TfcliError(f"{folder} has no {WEIGHTS_FILE}")
    tensors = read_tensors(folder / WEIGHTS_FILE, sae.shapes())
    with torch.no_grad():
        for name, tensor in tensors.items():
            getattr(sae, name).copy_(tensor)
    return sae.eval().requires_grad_(False), config


def load_sae_for(folder: Path, model: nn.Module, run: Path | str | None = None) -> tuple[SparseAutoencoder, SaeConfig]:
    """The SAE in `folder`, checked against the model it will read: its hook exists there, with vectors of
    width d_in. Moved to the model's device. Where `run` (the model's run directory) is not the run the SAE
    names as its own, a note says so: an SAE on a fine-tuned child of its run is a fair use, one on an unrelated
    run of the same shape reads features that mean nothing there."""
    sae, config = load_sae(folder)
    named = run if run is not None else "the run"
    widths = hook_widths(model)
    if config.hook_name not in widths and "decoder." + config.hook_name not in widths:
        try:
            resolve_hook(model, config.hook_name, widths)
        except TfcliError as exc:
            raise TfcliError(f"the SAE in {folder} reads {config.hook_name}, which {named} does not have", hint=exc.hint) from None
    name = resolve_hook(model, config.hook_name, widths)
    if widths[name] != config.d_in:
        raise TfcliError(
            f"the SAE in {folder} reads vectors of width {config.d_in} at {name}, but {named} gives {widths[name]} there",
            hint="use an SAE trained on this run (tfcli train sae)",
        )
    if run is not None and (note := another_run_note(folder, config, Path(run))) is not None:
        _log.warning("%s", note)
    return sae.to(next(model.parameters()).device), config


def another_run_note(folder: Path, config: SaeConfig, run: Path) -> str | None:
    """The note for an SAE whose cfg.json names another run than `run` (paths compared resolved; a relative
    one, as older SAEs recorded it, from the working folder); None where it names `run` or no run."""
    trained_on = config.metadata.get(RUN_KEY)
    if not isinstance(trained_on, str) or not trained_on or Path(trained_on).resolve() == Path(run).resolve():
        return None
    return f"the SAE in {folder} was trained on {trained_on}, not {run}; its features are that run's (fine for a fine-tune of it)"
