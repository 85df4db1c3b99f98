"""BERT: BertForMaskedLM, BertModel and BertForSequenceClassification.

A post-norm LayerNorm encoder with learned positions, token-type embeddings (tfcli reads one segment:
type 0), a LayerNorm over the embeddings, gelu, and biases everywhere; its masked-LM head is tfcli's
encoder head (dense, gelu, LayerNorm, the tied vocabulary projection with a bias), and its classifier
reads the pooler (tanh of a dense layer over the [CLS] state).

BertModel and BertForSequenceClassification have no masked-LM head: tfcli's encoder always has one, so
it is made fresh (as transformers initialises a head a checkpoint lacks) and never exported or counted.
"""

from __future__ import annotations

from typing import Any

import torch

from tfcli.errors import TfcliError
from tfcli.hf.folder import HfConfig
from tfcli.hf.mapping import TensorMap, incompatibility
from tfcli.model.config import ModelConfig

CLASSES = ("BertForMaskedLM", "BertModel", "BertForSequenceClassification")
HEADLESS = ("BertModel", "BertForSequenceClassification")  # no masked-LM head in the checkpoint
ACTIVATIONS_FROM_HF = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
ACTIVATIONS_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
MLM_HEAD = ("mlm_transform.weight", "mlm_transform.bias", "mlm_norm.weight", "mlm_norm.bias", "lm_head.bias")


def _labels(hf: HfConfig) -> list[str]:
    id2label = hf.get("id2label", dict, None)
    if id2label is None:
        return [f"LABEL_{i}" for i in range(hf.get("num_labels", int, 2))]
    try:
        labels = [id2label[str(i)] for i in range(len(id2label))]
    except KeyError:
        raise TfcliError(f"{hf.path} has id2label keys that are not 0 .. {len(id2label) - 1}") from None
    if not all(isinstance(name, str) for name in labels) or len(set(labels)) != len(labels):
        raise TfcliError(f"{hf.path} has id2label names that are not distinct strings")
    return labels


def model_config(hf: HfConfig, hf_class: str) -> tuple[ModelConfig, list[str]]:
    act = hf.get("hidden_act", str, "gelu")
    activation = ACTIVATIONS_FROM_HF.get(act)
    if activation is None or (hf_class == "BertForMaskedLM" and activation != "gelu"):
        raise TfcliError(f"{hf.path} has hidden_act {act!r}; tfcli's BERT uses gelu" + ("" if activation else ", gelu_new or relu"))
    if hf.get("position_embedding_type", str, "absolute") != "absolute":
        raise TfcliError(f"{hf.path} has position_embedding_type {hf.data['position_embedding_type']!r}; tfcli's BERT learns absolute positions")
    if hf.get("is_decoder", bool, False) or hf.get("add_cross_attention", bool, False):
        raise TfcliError(f"{hf.path} makes BERT a decoder; tfcli imports BERT encoders")
    notes = []
    n_classes = 0
    if hf_class == "BertForSequenceClassification":
        n_classes = len(_labels(hf))
        if n_classes < 2:
            raise TfcliError(f"{hf.path} has {n_classes} label (a regression head); tfcli's classifier needs at least two")
    else:
        notes.append(f"{hf_class} has no masked-LM head: tfcli's encoder gets a fresh one (train it before --fill-mask)" if hf_class in HEADLESS else "")
    config = ModelConfig(
        arch="encoder",
        vocab_size=hf.get("vocab_size", int),
        block_size=hf.get("max_position_embeddings", int),
        n_layers=hf.get("num_hidden_layers", int),
        n_heads=hf.get("num_attention_heads", int),
        d_model=hf.get("hidden_size", int),
        d_ff=hf.get("intermediate_size", int),
        positions="learned",
        norm="layernorm",
        norm_placement="post",
        norm_eps=hf.get("layer_norm_eps", float, 1e-12),
        activation=activation,
        dropout=hf.get("hidden_dropout_prob", float, 0.1),
        bias=True,
        tie_embeddings=hf.get("tie_word_embeddings", bool, True),
        init_std=hf.get("initializer_range", float, 0.02),
        n_classes=n_classes,
        type_vocab_size=hf.get("type_vocab_size", int, 2),
        embedding_norm=True,
        pooler=hf_class in HEADLESS,
    )
    if config.type_vocab_size < 1:
        raise TfcliError(f"{hf.path} has type_vocab_size {config.type_vocab_size}; BERT has at least one token type")
    return config, [n for n in notes if n]


def labels(hf: HfConfig, hf_class: str) -> list[str] | None:
    return _labels(hf) if hf_class == "BertForSequenceClassification" else None


def tensor_maps(config: ModelConfig, hf_class: str) -> list[TensorMap]:
    """BertForMaskedLM's and BertForSequenceClassification's names (BertModel's lack the "bert." prefix)."""
    d = config.d_model
    maps = [
        TensorMap("tok_emb.weight", ("bert.embeddings.word_embeddings.weight",)),
        TensorMap("pos_emb.weight", ("bert.embeddings.position_embeddings.weight",)),
        TensorMap("type_emb.weight", ("bert.embeddings.token_type_embeddings.weight",)),
        TensorMap("emb_norm.weight", ("bert.embeddings.LayerNorm.weight",)),
        TensorMap("emb_norm.bias", ("bert.embeddings.LayerNorm.bias",)),
    ]
    for i in range(config.n_layers):
        ours, theirs = f"encoder.blocks.{i}", f"bert.encoder.layer.{i}"
        for kind in ("weight", "bias"):
            maps += [
                TensorMap(f"{ours}.attn.qkv.{kind}", tuple(f"{theirs}.attention.self.{p}.{kind}" for p in ("query", "key", "value")), (d, d, d)),
                TensorMap(f"{ours}.attn.out.{kind}", (f"{theirs}.attention.output.dense.{kind}",)),
                TensorMap(f"{ours}.attn_norm.{kind}", (f"{theirs}.attention.output.LayerNorm.{kind}",)),
                TensorMap(f"{ours}.mlp.fc.{kind}", (f"{theirs}.intermediate.dense.{kind}",)),
                TensorMap(f"{ours}.mlp.proj.{kind}", (f"{theirs}.output.dense.{kind}",)),
                TensorMap(f"{ours}.mlp_norm.{kind}", (f"{theirs}.output.LayerNorm.{kind}",)),
            ]
    if hf_class == "BertForMaskedLM":
        maps += [
            TensorMap("mlm_transform.weight", ("cls.predictions.transform.dense.weight",)),
            TensorMap("mlm_transform.bias", ("cls.predictions.transform.dense.bias",)),
            TensorMap("mlm_norm.weight", ("cls.predictions.transform.LayerNorm.weight",)),
            TensorMap("mlm_norm.bias", ("cls.predictions.transform.LayerNorm.bias",)),
            TensorMap("lm_head.bias", ("cls.predictions.bias",)),
        ]
        if not config.tie_embeddings:
            maps.append(TensorMap("lm_head.weight", ("cls.predictions.decoder.weight",)))
    else:
        maps += [TensorMap(f"pooler.{kind}", (f"bert.pooler.dense.{kind}",)) for kind in ("weight", "bias")]
        if hf_class == "BertForSequenceClassification":
            maps += [TensorMap(f"classifier.{kind}", (f"classifier.{kind}",)) for kind in ("weight", "bias")]
    if hf_class == "BertModel":  # save_pretrained names BertModel's tensors without the prefix
        maps = [TensorMap(m.ours, tuple(t.removeprefix("bert.") for t in m.theirs), m.split, m.transposed) for m in maps]
    return maps


def fresh_tensors(config: ModelConfig, hf_class: str) -> dict[str, torch.Tensor]:
    """The masked-LM head a BertModel or BertForSequenceClassification checkpoint lacks, initialised as tfcli
    initialises it (untied models also get a fresh vocabulary projection)."""
    if hf_class not in HEADLESS:
        return {}
    d = config.d_model
    generator = torch.Generator().manual_seed(0)
    fresh = {
        "mlm_transform.weight": torch.randn(d, d, generator=generator) * config.init_std,
        "mlm_transform.bias": torch.zeros(d),
        "mlm_norm.weight": torch.ones(d),
        "mlm_norm.bias": torch.zeros(d),
        "lm_head.bias": torch.zeros(config.vocab_size),
    }
    if not config.tie_embeddings:
        fresh["lm_head.weight"] = torch.randn(config.vocab_size, d, generator=generator) * config.init_std
    return fresh


def choose_class(config: ModelConfig, recorded: str | None) -> str:
    """A classifier exports as BertForSequenceClassification, an encoder with a pooler and no classifier as
    BertModel (its masked-LM head is left out), any other as BertForMaskedLM."""
    if config.n_classes:
        return "BertForSequenceClassification"
    return "BertModel" if config.pooler else "BertForMaskedLM"


def incompatible(config: ModelConfig, hf_class: str) -> str | None:
    return incompatibility(
        [
            (config.arch == "encoder", f"arch {config.arch!r} (BERT is an encoder)"),
            (config.positions == "learned", f"positions {config.positions!r} (BERT learns its positions)"),
            (config.norm == "layernorm", f"norm {config.norm!r} (BERT uses LayerNorm)"),
            (config.norm_placement == "post", f"norm_placement {config.norm_placement!r} (BERT is post-norm)"),
            (config.embedding_norm, "embedding_norm false (BERT normalises its embeddings: set embedding_norm=true)"),
            (config.type_vocab_size >= 1, "type_vocab_size 0 (BERT has token-type embeddings: set type_vocab_size=2)"),
            (config.activation in ACTIVATIONS_TO_HF, f"activation {config.activation!r} (BERT has gelu, gelu_tanh or relu)"),
            (
                hf_class != "BertForMaskedLM" or config.activation == "gelu",
                f"activation {config.activation!r} with a masked-LM head (tfcli's head uses gelu, BERT's the model's activation)",
            ),
            (config.kv_heads == config.n_heads, f"n_kv_heads {config.kv_heads} (BERT has multi-head attention only)"),
            (config.bias and config.has_qkv_bias and config.has_mlp_bias, "bias false (BERT's layers have biases)"),
            (
                hf_class != "BertForSequenceClassification" or config.pooler,
                "a classifier without the pooler (BertForSequenceClassification reads it: set pooler=true)",
            ),
        ]
    )


def hf_config(config: ModelConfig, hf_class: str, special_ids: dict[str, int]) -> dict[str, Any]:
    return {
        "architectures": [hf_class],
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "intermediate_size": config.hidden_dim,
        "hidden_act": ACTIVATIONS_TO_HF[config.activation],
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.dropout,
        "max_position_embeddings": config.block_size,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.init_std,
        "layer_norm_eps": config.norm_eps,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": config.tie_embeddings,
        "pad_token_id": special_ids.get("pad", 0),
        "torch_dtype": "float32",
    }
