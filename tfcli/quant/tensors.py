"""A quantized run's model.safetensors read with every check first: the block bytes of each quantized tensor
(uint8, rows x bytes per row, its format named in config.json), the others as floats, before any is used.
Never unpickles."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from tfcli.errors import TfcliError
from tfcli.quant.formats import block_format, dequantize, quantize, scales_finite
from tfcli.tensorfile import safetensors_path


@dataclasses.dataclass
class Blocks:
    """One quantized matrix: `data` the block bytes, uint8 (rows, bytes per row), of `format` (q8_0, q4_K, ...);
    `shape` the matrix it stands for (rows, columns)."""

    data: torch.Tensor
    format: str
    shape: tuple[int, int]

    def dequantized(self) -> torch.Tensor:
        """The float32 matrix (rows, columns)."""
        return torch.from_numpy(dequantize(self.data.numpy(), self.format, self.shape[1]))


def stored_shape(shape: tuple[int, ...], name: str, fmt: str, where: Path) -> tuple[int, int]:
    """The uint8 shape the block bytes of a matrix of `shape` take, or one line on why the matrix cannot be held so."""
    kind = block_format(fmt, where=f"{where}: the type of {name}")
    if len(shape) != 2:
        raise TfcliError(f"{where} quantizes {name}, which is not a matrix", hint="restore the run's own config.json")
    if not kind.fits(shape[1]):
        raise TfcliError(
            f"{where}: {name}'s rows of {shape[1]} values are not a whole number of {fmt} blocks of {kind.block_size}",
            hint="restore the run's own config.json, or quantize the run again",
        )
    return shape[0], kind.row_bytes(shape[1])


def read_quantized(path: Path, expected: dict[str, tuple[int, ...]], types: dict[str, str], config: Path) -> dict[str, torch.Tensor | Blocks]:
    """The tensors of `path`, which must hold exactly `expected` (name -> the model's shape): those `types` names
    as Blocks (uint8, whole blocks, finite scales), the others floats (finite, as float32)."""
    unknown = sorted(set(types) - set(expected))
    if unknown:
        raise TfcliError(f"{config} gives a type to {unknown[0]}, which is not a tensor of this model", hint="restore the run's own config.json")
    stored = {name: stored_shape(shape, name, types[name], config) if name in types else tuple(shape) for name, shape in expected.items()}
    try:
        with safe_open(safetensors_path(path), framework="pt") as handle:
            names = set(handle.keys())
            missing, extra = sorted(set(stored) - names), sorted(names - set(stored))
            if missing:
                raise TfcliError(f"{path} lacks the tensor {missing[0]}")
            if extra:
                raise TfcliError(f"{path} holds an unexpected tensor {extra[0]}", hint="the weights do not belong to this config")
            for name in sorted(names):
                shape = tuple(handle.get_slice(name).get_shape())
                if shape != stored[name]:
                    raise TfcliError(f"tensor {name} has shape {list(shape)} but the config implies {list(stored[name])}")
            tensors = {name: handle.get_tensor(name) for name in sorted(names)}
    except SafetensorError as exc:
        raise TfcliError(f"{path} is not a valid safetensors file ({exc})", hint="the file is truncated or corrupted") from exc
    out: dict[str, torch.Tensor | Blocks] = {}
    for name, tensor in tensors.items():
        if name in types:
            if tensor.dtype != torch.uint8:
                raise TfcliError(f"tensor {name} has dtype {tensor.dtype}, not the uint8 bytes of {types[name]} blocks")
            if not scales_finite(tensor.numpy(), types[name]):
                raise TfcliError(f"tensor {name} has non-finite scales (NaN or infinity) in its {types[name]} blocks", hint="use an intact run directory")
            out[name] = Blocks(tensor, types[name], (int(expected[name][0]), int(expected[name][1])))
            continue
        if not tensor.is_floating_point():
            raise TfcliError(f"tensor {name} has dtype {tensor.dtype}, not a floating-point type")
        if not tensor.isfinite().all():
            raise TfcliError(f"tensor {name} holds non-finite values (NaN or infinity)", hint="use an earlier checkpoint")
        out[name] = tensor.float()
    return out


def quantized_bytes(values: torch.Tensor, fmt: str) -> torch.Tensor:
    """A float matrix as the uint8 block bytes of `fmt`."""
    return torch.from_numpy(quantize(values.detach().to("cpu", torch.float32).numpy(), fmt))
