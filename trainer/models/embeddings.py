"""Numerical embeddings for the tabular MLP: each input column becomes a few periodic features.

An MLP on standardised inputs is smooth in each input: it cannot follow a daily cycle in an
hour-of-day column, or a threshold that a tree finds in one split, without many steps and
units. Periodic embeddings (Gorishniy et al., 2022, "On Embeddings for Numerical Features in
Tabular Deep Learning") give each column its own learned frequencies first. This module is
RealMLP's PBLD variant (Holzmüller et al., 2024): per column, ``cos(2 pi (w x + b))`` with
:data:`FREQUENCIES` frequencies ``w ~ N(0, sigma^2)`` and phases ``b ~ U(-1/2, 1/2)``, a small
linear map of those to :data:`DIM` - 1 numbers, and the column itself beside them (the
"densenet" part: the embedding can only add to what the plain input offers).

Inputs are first clipped smoothly (``x / sqrt(1 + (x / 3)^2)``, RealMLP's soft clipping): a
standardised column with outliers (incomes, counts) keeps its bulk where the frequencies act.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["DIM", "FREQUENCIES", "SIGMA", "PeriodicEmbedding", "soft_clip"]

FREQUENCIES = 16
"""Frequencies per column (RealMLP's PBLD: 16)."""
DIM = 4
"""Numbers per column out of the embedding, the column itself included (RealMLP's PBLD: 4)."""
SIGMA = 0.1
"""Standard deviation of the initial frequencies, in cycles per standard deviation of the
input (RealMLP's default; the frequencies are trained)."""
CLIP = 3.0
"""Scale of the soft clipping: values well inside +-3 pass nearly unchanged."""


def soft_clip(x: torch.Tensor, scale: float = CLIP) -> torch.Tensor:
    """``x / sqrt(1 + (x / scale)^2)``: identity near 0, bounded by ``scale`` (smoothly)."""
    return x / torch.sqrt(1.0 + (x / scale) ** 2)


class PeriodicEmbedding(nn.Module):
    """``[B, F]`` features to ``[B, F * DIM]``: each column, then its periodic features.

    Weights are drawn from the global generator at construction (seed before building).

    Args:
        in_features: Number of input columns ``F``.
        frequencies: Frequencies per column.
        dim: Output numbers per column, the column itself included (>= 2).
        sigma: Standard deviation of the initial frequencies.
    """

    def __init__(
        self,
        in_features: int,
        frequencies: int = FREQUENCIES,
        dim: int = DIM,
        sigma: float = SIGMA,
    ) -> None:
        super().__init__()
        if in_features <= 0 or frequencies <= 0 or dim < 2 or sigma <= 0:
            raise ValueError(
                f"PeriodicEmbedding needs positive sizes and dim >= 2, got in_features="
                f"{in_features}, frequencies={frequencies}, dim={dim}, sigma={sigma}"
            )
        self.frequency = nn.Parameter(torch.randn(in_features, frequencies) * sigma)
        self.phase = nn.Parameter(torch.rand(in_features, frequencies) - 0.5)
        bound = 1.0 / math.sqrt(frequencies)  # nn.Linear's initialisation, per column
        self.weight = nn.Parameter(
            torch.empty(in_features, frequencies, dim - 1).uniform_(-bound, bound)
        )
        self.bias = nn.Parameter(torch.empty(in_features, dim - 1).uniform_(-bound, bound))
        self.in_features = in_features
        self.out_features = in_features * dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``[B, F]`` to ``[B, F * DIM]`` (per column: the clipped input, then the rest)."""
        x = soft_clip(x)
        waves = torch.cos(2 * math.pi * (x.unsqueeze(-1) * self.frequency + self.phase))
        out = torch.einsum("bfk,fkd->bfd", waves, self.weight) + self.bias
        return torch.cat([x.unsqueeze(-1), out], dim=-1).flatten(1)
