"""A safetensors file read with every check first: the header against the file's size, the names and shapes
against what is expected, floating point and finite values, before a tensor is used. Never unpickles."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import SafetensorError, safe_open

from tfcli.errors import TfcliError

if TYPE_CHECKING:
    import torch  # the header check needs no torch; the tensors read are torch's (their own methods)


def safetensors_path(path: Path) -> str:
    """PATH as safetensors opens it (a Rust string), or one line where it cannot: a name that is not UTF-8."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise TfcliError(
            f"{path!r} is not a UTF-8 path, and safetensors opens only those", hint="rename the folder (or file) with a UTF-8 name, or copy it to one"
        ) from None
    return text


def weights_header_problem(weights: Path) -> TfcliError | None:
    """Whether the weights file's header reads: safetensors checks every tensor's offsets against the file's
    size, so a header that claims huge tensors in a small file is refused here, before anything is allocated."""
    try:
        with safe_open(safetensors_path(weights), framework="numpy") as handle:
            handle.keys()
    except (SafetensorError, OSError) as exc:
        return _invalid_weights(weights, exc)
    return None


def _invalid_weights(weights: Path, exc: BaseException) -> TfcliError:
    return TfcliError(f"{weights} is not a valid safetensors file ({exc})", hint="the file is truncated or corrupted")


def read_tensors(path: Path, expected: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file that must hold exactly `expected` (name -> shape), each checked
    (names, shapes from the header first, floating point, finite) before it is used."""
    try:
        with safe_open(safetensors_path(path), framework="pt") as handle:
            names = set(handle.keys())
            missing = sorted(set(expected) - names)
            unexpected = sorted(names - set(expected))
            if missing:
                raise TfcliError(
                    f"{path} lacks the tensor {missing[0]} (and {len(missing) - 1} more)" if len(missing) > 1 else f"{path} lacks the tensor {missing[0]}"
                )
            if unexpected:
                raise TfcliError(f"{path} holds an unexpected tensor {unexpected[0]}", hint="the weights do not belong to this config")
            for name in sorted(names):
                shape = tuple(handle.get_slice(name).get_shape())
                if shape != expected[name]:
                    raise TfcliError(f"tensor {name} has shape {list(shape)} but the config implies {list(expected[name])}")
            tensors = {name: handle.get_tensor(name) for name in sorted(names)}
    except SafetensorError as exc:
        raise _invalid_weights(path, exc) from exc
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            raise TfcliError(f"tensor {name} has dtype {tensor.dtype}, not a floating-point type")
        if not tensor.isfinite().all():
            raise TfcliError(f"tensor {name} holds non-finite values (NaN or infinity)", hint="use an earlier checkpoint")
    return {k: v.float() for k, v in tensors.items()}
