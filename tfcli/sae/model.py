"""The sparse autoencoder, named as SAELens names it: W_enc (d_in, d_sae), b_enc (d_sae), W_dec (d_sae, d_in),
b_dec (d_in), and for JumpReLU a threshold (d_sae). Encoding subtracts b_dec first (SAELens's
apply_b_dec_to_input); each architecture differs only in how the pre-activations become features:

- topk: the k largest pre-activations of each vector kept (ReLU'd), every other feature 0;
- standard (tfcli's --arch relu): ReLU;
- jumprelu: a pre-activation kept where it is above its feature's threshold, else 0.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from tfcli.errors import TfcliError
from tfcli.runtime import physical_memory

Architecture = Literal["topk", "standard", "jumprelu"]
ARCHITECTURES: tuple[str, ...] = ("topk", "standard", "jumprelu")
ARCH_NAMES = {"topk": "topk", "relu": "standard", "jumprelu": "jumprelu"}  # --arch -> SAELens's architecture


def refuse_what_memory_cannot_hold(d_in: int, d_sae: int, buffer: int, device: str = "cpu") -> None:
    """Training holds the activation buffer (buffer x d_in floats) and W_enc and W_dec with their gradients and
    Adam's two moments (8 x d_in x d_sae floats); where that alone passes the device's memory (this machine's,
    or a GPU's own), say so before anything is allocated, not in an allocation error or the kernel's kill."""
    on_gpu = str(device).startswith("cuda") and torch.cuda.is_available()
    total = torch.cuda.get_device_properties(torch.device(device)).total_memory if on_gpu else physical_memory()
    need = 4 * (buffer * d_in + 8 * d_in * d_sae)
    if total and need > total:
        raise TfcliError(
            f"{d_sae:,} features on a hook of width {d_in:,} with a buffer of {buffer:,} vectors need {need / 1e9:,.1f} GB; "
            f"{'the GPU' if on_gpu else 'this machine'} has {total / 1e9:,.1f} GB",
            hint="use a smaller --width (or --expansion) or --buffer",
        )


class SparseAutoencoder(nn.Module):
    """x (..., d_in) -> features (..., d_sae) -> reconstruction (..., d_in).

    Example: sae = SparseAutoencoder(32, 128, "topk", k=8); sae.decode(sae.encode(x)).shape == x.shape
    """

    def __init__(
        self,
        d_in: int,
        d_sae: int,
        architecture: Architecture,
        k: int | None = None,
        apply_b_dec_to_input: bool = True,
        rescale_acts_by_decoder_norm: bool = False,
    ) -> None:
        super().__init__()
        assert architecture in ARCHITECTURES, architecture
        assert (k is not None) == (architecture == "topk"), "k goes with topk only"
        self.d_in, self.d_sae, self.architecture, self.k = d_in, d_sae, architecture, k
        self.apply_b_dec_to_input = apply_b_dec_to_input
        # topk as SAELens may save it: features chosen and scaled as if the decoder rows had unit norm
        self.rescale_acts_by_decoder_norm = rescale_acts_by_decoder_norm
        W_dec = torch.empty(d_sae, d_in)
        nn.init.kaiming_uniform_(W_dec, a=math.sqrt(5))
        W_dec /= W_dec.norm(dim=1, keepdim=True)  # unit-norm decoder directions
        self.W_dec = nn.Parameter(W_dec)
        self.W_enc = nn.Parameter(0.1 * W_dec.T.contiguous())  # the decoder's transpose, small (as SAELens's decoder_init_norm 0.1)
        self.b_enc = nn.Parameter(torch.zeros(d_sae))
        self.b_dec = nn.Parameter(torch.zeros(d_in))
        if architecture == "jumprelu":
            self.threshold = nn.Parameter(torch.full((d_sae,), 1e-3))

    def pre_activations(self, x: torch.Tensor) -> torch.Tensor:
        """(..., d_in) -> (..., d_sae): what each feature's nonlinearity reads."""
        if self.apply_b_dec_to_input:
            x = x - self.b_dec
        pre = x @ self.W_enc + self.b_enc
        return pre * self.W_dec.norm(dim=-1) if self.rescale_acts_by_decoder_norm else pre

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        """The architecture's nonlinearity on the pre-activations (..., d_sae)."""
        if self.architecture == "topk":
            values, indices = pre.topk(self.k, dim=-1, sorted=False)  # (..., k)
            return torch.zeros_like(pre).scatter_(-1, indices, values.relu())
        if self.architecture == "jumprelu":
            return pre.relu() * (pre > self.threshold)
        return pre.relu()

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """(..., d_in) -> the features (..., d_sae), most of them 0."""
        return self.activate(self.pre_activations(x))

    def decode(self, features: torch.Tensor) -> torch.Tensor:
        """(..., d_sae) -> the reconstruction (..., d_in)."""
        if self.rescale_acts_by_decoder_norm:
            features = features / self.W_dec.norm(dim=-1)
        return features @ self.W_dec + self.b_dec

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x))

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each tensor's name and shape, as sae_weights.safetensors holds them."""
        shapes = {"W_enc": (self.d_in, self.d_sae), "b_enc": (self.d_sae,), "W_dec": (self.d_sae, self.d_in), "b_dec": (self.d_in,)}
        return shapes | ({"threshold": (self.d_sae,)} if self.architecture == "jumprelu" else {})
