"""Hugging Face GPT-2 interop: export a tfcli decoder to a folder `GPT2LMHeadModel.from_pretrained` loads,
and import a GPT-2 folder (config.json + model.safetensors, as the hub publishes it) into a run directory.

GPT-2 stores its linear layers as Conv1D, weights (in, out): the transpose of ours. Its square
`attn.c_proj` loads silently either way, so only logit parity proves a conversion right (the tests check it).
Nothing here needs transformers; loading is safetensors only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfcli.checkpoint import WEIGHTS_FILE, load_checkpoint, read_run_config, save_checkpoint
from tfcli.errors import TfcliError
from tfcli.fsutil import atomic_write_json, atomic_write_text, prepare_output_dir
from tfcli.model.config import ModelConfig
from tfcli.tokenizer.core import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, TextTokenizer

if TYPE_CHECKING:
    import torch

ACTIVATIONS_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
ACTIVATIONS_FROM_HF = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


def gpt2_incompatibility(config: ModelConfig) -> str | None:
    """The first option GPT-2 cannot express, as a sentence, or None."""
    checks = [
        (config.arch == "decoder", f"arch {config.arch!r} (GPT-2 is a decoder)"),
        (config.positions == "learned", f"positions {config.positions!r} (GPT-2 learns its positions)"),
        (config.norm == "layernorm", f"norm {config.norm!r} (GPT-2 uses LayerNorm)"),
        (config.norm_placement == "pre", f"norm_placement {config.norm_placement!r} (GPT-2 is pre-norm)"),
        (config.activation in ACTIVATIONS_TO_HF, f"activation {config.activation!r} (GPT-2 has gelu, gelu_tanh or relu)"),
        (config.kv_heads == config.n_heads, f"n_kv_heads {config.kv_heads} (GPT-2 has multi-head attention only: n_kv_heads = n_heads)"),
        (config.bias, "bias false (GPT-2's linear layers and norms have biases)"),
        (config.n_classes == 0, "a classification head (GPT2LMHeadModel has none)"),
    ]
    return next((message for ok, message in checks if not ok), None)


# (our sublayer, GPT-2's sublayer, stored as Conv1D: weight transposed); each has a weight and a bias.
_BLOCK_SUBLAYERS = [
    ("attn_norm", "ln_1", False),
    ("attn.qkv", "attn.c_attn", True),
    ("attn.out", "attn.c_proj", True),
    ("mlp_norm", "ln_2", False),
    ("mlp.fc", "mlp.c_fc", True),
    ("mlp.proj", "mlp.c_proj", True),
]


def _layer_names(i: int) -> list[tuple[str, str, bool]]:
    """(our name, GPT-2 name, transposed) for block i."""
    return [
        (f"decoder.blocks.{i}.{ours}.{kind}", f"transformer.h.{i}.{theirs}.{kind}", conv1d and kind == "weight")
        for ours, theirs, conv1d in _BLOCK_SUBLAYERS
        for kind in ("weight", "bias")
    ]


def _name_map(config: ModelConfig) -> list[tuple[str, str, bool]]:
    names = [("tok_emb.weight", "transformer.wte.weight", False), ("pos_emb.weight", "transformer.wpe.weight", False)]
    for i in range(config.n_layers):
        names += _layer_names(i)
    names += [("decoder.norm.weight", "transformer.ln_f.weight", False), ("decoder.norm.bias", "transformer.ln_f.bias", False)]
    if not config.tie_embeddings:
        names.append(("lm_head.weight", "lm_head.weight", False))
    return names


def gpt2_config(config: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_embd": config.d_model,
        "n_layer": config.n_layers,
        "n_head": config.n_heads,
        "n_inner": config.hidden_dim,
        "activation_function": ACTIVATIONS_TO_HF[config.activation],
        "layer_norm_epsilon": config.norm_eps,
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "initializer_range": config.init_std,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
    }


def _refuse_to_overwrite(folder: Path, what: str, verb: str) -> None:
    """Both directions write config.json and model.safetensors; what is already there is never replaced."""
    if any((folder / name).exists() for name in ("config.json", WEIGHTS_FILE)):
        held = "a tfcli run" if _is_tfcli_run(folder) else what
        raise TfcliError(f"{folder} already holds {held}", hint=f"{verb} into another folder with -o, or delete that one first")


def export_gpt2(run_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Write OUT/config.json, OUT/model.safetensors and the tokenizer files for GPT2LMHeadModel."""
    from safetensors.torch import save_file

    from tfcli.fsutil import set_default_mode, temp_path_beside

    _refuse_to_overwrite(Path(out_dir), "an exported model", "export")
    checkpoint = load_checkpoint(run_dir)
    config = checkpoint.config.model
    problem = gpt2_incompatibility(config)
    if problem:
        raise TfcliError(f"GPT-2 cannot express this model: {problem}", hint="only decoders with GPT-2's options export to Hugging Face GPT-2")
    out_dir = prepare_output_dir(out_dir, "export")
    state = checkpoint.model.state_dict()
    tensors = {}
    for ours, theirs, transposed in _name_map(config):
        tensor = state[ours].detach()
        tensors[theirs] = (tensor.t() if transposed else tensor).contiguous()
    weights_tmp = temp_path_beside(out_dir / WEIGHTS_FILE)
    try:
        save_file(tensors, str(weights_tmp), metadata={"format": "pt"})
        set_default_mode(weights_tmp)
        weights_tmp.replace(out_dir / WEIGHTS_FILE)
    finally:
        weights_tmp.unlink(missing_ok=True)
    hf_config = gpt2_config(config, checkpoint.tokenizer.special_ids.get("eos"))
    atomic_write_json(out_dir / "config.json", hf_config)
    atomic_write_text(out_dir / TOKENIZER_FILE, checkpoint.tokenizer.path.read_text(encoding="utf-8"))
    tokenizer_config_path = checkpoint.tokenizer.path.parent / TOKENIZER_CONFIG_FILE
    if tokenizer_config_path.is_file():
        tokenizer_config = json.loads(tokenizer_config_path.read_text(encoding="utf-8"))
        tokenizer_config["model_max_length"] = config.block_size
        atomic_write_json(out_dir / TOKENIZER_CONFIG_FILE, tokenizer_config)
    return hf_config


def _read_gpt2_config(src: Path) -> tuple[ModelConfig, dict[str, Any]]:
    path = src / "config.json"
    if not path.is_file():
        raise TfcliError(f"{src} has no config.json", hint="pass a Hugging Face GPT-2 folder (config.json + model.safetensors)")
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TfcliError(f"{path} is not valid JSON ({exc})") from exc
    if not isinstance(hf, dict) or hf.get("model_type") != "gpt2":
        raise TfcliError(f"{path} describes model_type {hf.get('model_type') if isinstance(hf, dict) else None!r}, not gpt2", hint="tfcli imports GPT-2 models")
    activation = ACTIVATIONS_FROM_HF.get(hf.get("activation_function", "gelu_new"))
    if activation is None:
        raise TfcliError(f"GPT-2 activation_function {hf.get('activation_function')!r} has no tfcli equivalent")
    if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("scale_attn_weights") is False or hf.get("add_cross_attention"):
        raise TfcliError("this GPT-2 config scales or extends attention in a way tfcli does not implement")
    for key in ("vocab_size", "n_positions", "n_layer", "n_head", "n_embd", "n_inner"):
        value = hf.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TfcliError(f"{path} has {key} {json.dumps(value)}, which is not a whole number")
    try:
        config = ModelConfig(
            arch="decoder", vocab_size=hf["vocab_size"], block_size=hf["n_positions"], n_layers=hf["n_layer"],
            n_heads=hf["n_head"], d_model=hf["n_embd"], d_ff=hf.get("n_inner") or 4 * hf["n_embd"],
            positions="learned", norm="layernorm", norm_placement="pre", norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
            activation=activation, dropout=float(hf.get("resid_pdrop", 0.0)), bias=True,
            tie_embeddings=bool(hf.get("tie_word_embeddings", True)), init_std=float(hf.get("initializer_range", 0.02)),
        )
    except KeyError as exc:
        raise TfcliError(f"{path} lacks the key {exc.args[0]!r}") from exc
    except TypeError as exc:
        raise TfcliError(f"{path} has a value of the wrong type ({exc})") from exc
    return config, hf


def _import_tokenizer(src: Path, run_dir: Path) -> TextTokenizer:
    """tokenizer.json if the folder has one, else GPT-2's vocab.json + merges.txt, written into the run dir."""
    if (src / TOKENIZER_FILE).is_file():
        text = (src / TOKENIZER_FILE).read_text(encoding="utf-8")
    elif (src / "vocab.json").is_file() and (src / "merges.txt").is_file():
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        hf = Tokenizer(models.BPE.from_file(str(src / "vocab.json"), str(src / "merges.txt")))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        if hf.token_to_id("<|endoftext|>") is not None:
            hf.add_special_tokens(["<|endoftext|>"])
        text = hf.to_str(pretty=True)
    else:
        raise TfcliError(f"{src} has no tokenizer (tokenizer.json, or vocab.json and merges.txt)", hint="copy the model's tokenizer files into the folder")
    atomic_write_text(run_dir / TOKENIZER_FILE, text)
    if (src / TOKENIZER_CONFIG_FILE).is_file():
        atomic_write_text(run_dir / TOKENIZER_CONFIG_FILE, (src / TOKENIZER_CONFIG_FILE).read_text(encoding="utf-8"))
    return TextTokenizer.load(run_dir / TOKENIZER_FILE)


def _is_tfcli_run(folder: Path) -> bool:
    try:
        read_run_config(folder)
    except TfcliError:
        return False
    return True


def import_gpt2(src: Path, run_dir: Path) -> ModelConfig:
    """Read a GPT-2 folder (safetensors only) and save it as a tfcli run directory."""
    import torch
    from safetensors import SafetensorError, safe_open

    from tfcli.model.transformer import Transformer

    src = Path(src)
    if not src.is_dir():
        raise TfcliError(f"{src} is not a folder", hint="pass a Hugging Face GPT-2 folder (config.json + model.safetensors)")
    _refuse_to_overwrite(Path(run_dir), "a run", "import")
    if _is_tfcli_run(src):
        raise TfcliError(f"{src} is a tfcli run already; there is nothing to import", hint="use it as it is, or copy the folder")
    config, _ = _read_gpt2_config(src)
    weights = src / WEIGHTS_FILE
    if not weights.is_file():
        pickles = [p.name for p in src.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
        hint = "tfcli never loads pickle; convert the weights to safetensors with a tool you trust" if pickles else None
        raise TfcliError(f"{src} has no {WEIGHTS_FILE}" + (f" (only {pickles[0]}, a pickle file)" if pickles else ""), hint=hint)
    try:
        with safe_open(str(weights), framework="pt") as handle:
            stored = {name: handle.get_tensor(name) for name in handle.keys()}
    except SafetensorError as exc:
        raise TfcliError(f"{weights} is not a valid safetensors file ({exc})") from exc
    # The hub's files name GPT2Model's tensors without the "transformer." prefix; both forms are accepted.
    stored = {name if name.startswith(("transformer.", "lm_head.")) else f"transformer.{name}": t for name, t in stored.items()}
    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in Transformer(config).state_dict().items()}
    state: dict[str, torch.Tensor] = {}
    for ours, theirs, transposed in _name_map(config):
        if theirs not in stored:
            raise TfcliError(f"{weights} lacks the tensor {theirs}")
        tensor = stored[theirs].to(torch.float32)
        tensor = tensor.t().contiguous() if transposed else tensor
        if tuple(tensor.shape) != expected[ours]:
            raise TfcliError(f"tensor {theirs} has shape {list(stored[theirs].shape)}, which does not fit the config")
        if not torch.isfinite(tensor).all():
            raise TfcliError(f"tensor {theirs} holds non-finite values")
        state[ours] = tensor
    if config.tie_embeddings:
        state["lm_head.weight"] = state["tok_emb.weight"]
    run_dir = prepare_output_dir(run_dir, "run")
    tokenizer = _import_tokenizer(src, run_dir)
    if tokenizer.vocab_size > config.vocab_size:  # fewer is fine: the model's vocabulary was padded (nanoGPT: 50,304)
        raise TfcliError(f"the tokenizer in {src} has {tokenizer.vocab_size:,} tokens but the model only {config.vocab_size:,}")
    model = Transformer(config)
    model.load_state_dict(state, strict=True)
    save_checkpoint(run_dir, model, tokenizer, source=str(src))
    return config
