"""Small building blocks: norms, positional encodings (sinusoidal, rotary) and the MLP."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tfcli.model.config import ModelConfig, RopeScaling
from tfcli.model.hook_point import add_hook_points


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def make_norm(config: ModelConfig, dim: int | None = None) -> nn.Module:
    """The config's norm over the last `dim` features (default: the residual stream's d_model)."""
    dim = config.d_model if dim is None else dim
    if config.norm == "rmsnorm":
        return RMSNorm(dim, config.norm_eps)
    return nn.LayerNorm(dim, eps=config.norm_eps, bias=config.bias)


def sinusoidal_table(length: int, dim: int) -> torch.Tensor:
    """Vaswani et al.: PE[pos, 2i] = sin(pos / 10000^(2i/dim)), PE[pos, 2i+1] = cos(same). Shape (length, dim)."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)  # (L, 1)
    inverse_frequency = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))  # (dim/2,)
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * inverse_frequency)
    table[:, 1::2] = torch.cos(position * inverse_frequency)
    return table


def scaled_frequencies(inverse_frequency: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Rotary frequencies stretched for a longer context: linear divides them all by the factor; llama3
    (Llama 3.1) divides the low ones (long wavelengths), keeps the high ones, and blends in between;
    longrope (Phi-3) divides each by its own short factor."""
    if scaling.kind == "linear":
        return inverse_frequency / scaling.factor
    if scaling.kind == "longrope":
        return inverse_frequency / torch.tensor(scaling.short_factor, dtype=torch.float32)  # (hs/2,)
    wavelength = 2 * math.pi / inverse_frequency  # (hs/2,)
    low_cutoff = scaling.original_context / scaling.low_freq_factor  # longer wavelengths: divided
    high_cutoff = scaling.original_context / scaling.high_freq_factor  # shorter: kept
    scaled = torch.where(wavelength > low_cutoff, inverse_frequency / scaling.factor, inverse_frequency)
    smooth = (scaling.original_context / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    between = (wavelength >= high_cutoff) & (wavelength <= low_cutoff)
    return torch.where(between, blended, scaled)


class RotaryEmbedding(nn.Module):
    """RoPE: rotate each (i, i + r/2) pair of q and k by an angle proportional to the position (longrope
    also scales q and k by its attention factor). r, the tables' width, is the head size, or less for partial
    rotary (Phi-4-mini's `partial_rotary_factor`): then the first r features of each head turn and the rest pass."""

    def __init__(self, head_dim: int, length: int, base: float, scaling: RopeScaling | None = None) -> None:
        """head_dim: the rotated width r (config.rotary_dim)."""
        super().__init__()
        inverse_frequency = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))  # (r/2,)
        if scaling is not None:
            inverse_frequency = scaled_frequencies(inverse_frequency, scaling)
        angles = torch.outer(torch.arange(length, dtype=torch.float32), inverse_frequency)  # (L, r/2)
        angles = torch.cat([angles, angles], dim=-1)  # (L, r)
        magnitude = scaling.attention_factor if scaling is not None else 1.0
        self.register_buffer("cos", angles.cos() * magnitude, persistent=False)
        self.register_buffer("sin", angles.sin() * magnitude, persistent=False)

    def forward(self, x: torch.Tensor, offset: int, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, heads, hs), rotated as if it started at position `offset`, or at each row's own
        `positions` (B, T) when given (left-padded batches)."""
        T = x.shape[1]
        if positions is not None:
            cos = self.cos[positions].unsqueeze(2).to(x.dtype)  # (B, T, 1, r)
            sin = self.sin[positions].unsqueeze(2).to(x.dtype)
        else:
            cos = self.cos[offset : offset + T].unsqueeze(1).to(x.dtype)  # (T, 1, r)
            sin = self.sin[offset : offset + T].unsqueeze(1).to(x.dtype)
        width = cos.shape[-1]
        if width < x.shape[-1]:  # partial rotary: the first r features turn, the others pass
            return torch.cat([self._turn(x[..., :width], cos, sin), x[..., width:]], dim=-1)
        return self._turn(x, cos, sin)

    @staticmethod
    def _turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (..., r) turned: each (x_i, x_{i + r/2}) pair by its angle."""
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


class MLP(nn.Module):
    """Position-wise feed-forward: up-projection, activation, down-projection (SwiGLU and GeGLU gate the up
    path: silu or tanh GELU of a gate, times up; ReLU², the speedrun's, squares relu's output). Hook points,
    as TransformerLens's: hook_pre (B, T, d_ff), what the activation reads (gated: the gate; its up path is
    hook_pre_linear (B, T, d_ff)), and hook_post (B, T, d_ff), the neurons' activations that the
    down-projection reads."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden = config.hidden_dim
        self.activation, self.gated = config.activation, config.gated_mlp
        self.fc = nn.Linear(config.d_model, 2 * hidden if self.gated else hidden, bias=config.has_mlp_bias)
        self.proj = nn.Linear(hidden, config.d_model, bias=config.has_mlp_bias)
        add_hook_points(self, "hook_pre", "hook_post")
        if self.gated:
            add_hook_points(self, "hook_pre_linear")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)  # (B, T, d_ff), or (B, T, 2 * d_ff) gated: gate then up
        if self.gated:
            gate, up = h.chunk(2, dim=-1)  # (B, T, d_ff) each
            gate = self.hook_pre(gate)
            h = (F.silu(gate) if self.activation == "swiglu" else F.gelu(gate, approximate="tanh")) * self.hook_pre_linear(up)
        elif self.activation == "relu":
            h = F.relu(self.hook_pre(h))
        elif self.activation == "relu2":
            h = F.relu(self.hook_pre(h)).square()
        else:
            h = F.gelu(self.hook_pre(h), approximate="tanh" if self.activation == "gelu_tanh" else "none")
        return self.proj(self.hook_post(h))
