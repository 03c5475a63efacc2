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

Frequencies of sigma 0.1 are smooth: a step (a label that changes with the recording year, a
threshold on a count) takes many of them. Piecewise-linear encodings (Gorishniy et al. 2022,
PLE) cut each column at :data:`BINS` quantiles of the training rows and give, per bin, how far
the value has come through it (0 below, 1 above): the next layer reads a step at any cut in one
weight, and a column with few distinct values (a year) gets cuts at its values.
:class:`PeriodicPiecewiseEmbedding` is both side by side.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from trainer.config import EMBEDDING_DIM, EMBEDDING_FREQUENCIES

__all__ = [
    "BINS",
    "DIM",
    "FREQUENCIES",
    "MAX_QUANTILE_ROWS",
    "SIGMA",
    "PeriodicEmbedding",
    "PeriodicPiecewiseEmbedding",
    "PiecewiseLinearEncoding",
    "soft_clip",
]

FREQUENCIES = EMBEDDING_FREQUENCIES
"""Frequencies per column (RealMLP's PBLD: 16; defined in trainer.config, which the train step
reads without torch)."""
DIM = EMBEDDING_DIM
"""Numbers per column out of the embedding, the column itself included (RealMLP's PBLD: 4)."""
SIGMA = 0.1
"""Standard deviation of the initial frequencies, in cycles per standard deviation of the
input (RealMLP's default; the frequencies are trained)."""
CLIP = 3.0
"""Scale of the soft clipping: values well inside +-3 pass nearly unchanged."""
BINS = 16
"""Piecewise-linear bins per column (cuts at the 1/16, 2/16, ... quantiles of the training rows)."""
MAX_QUANTILE_ROWS = 1 << 20
"""Quantiles are taken on at most this many training rows (evenly spaced: deterministic)."""
_MIN_WIDTH = 1e-6
"""A bin of repeated values (a column with few distinct values) is a step of this width."""


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


class PiecewiseLinearEncoding(nn.Module):
    """``[B, F]`` features to ``[B, F * (BINS + 1)]``: each column (soft-clipped), then per bin
    ``clamp((x - left) / (right - left), 0, 1)``.

    The bin edges are a buffer (saved with the model), evenly spaced over [-2, 2] (standardised
    inputs) until :meth:`fit_edges` sets them to quantiles of the training rows.

    Args:
        in_features: Number of input columns ``F``.
        bins: Bins per column.
    """

    edges: torch.Tensor

    def __init__(self, in_features: int, bins: int = BINS) -> None:
        super().__init__()
        if in_features <= 0 or bins <= 0:
            raise ValueError(
                f"PiecewiseLinearEncoding needs positive sizes, got in_features={in_features}, "
                f"bins={bins}"
            )
        self.register_buffer("edges", torch.linspace(-2.0, 2.0, bins + 1).repeat(in_features, 1))
        self.in_features = in_features
        self.out_features = in_features * (bins + 1)

    @torch.no_grad()
    def fit_edges(self, x: torch.Tensor) -> None:
        """Set the edges to the 0, 1/BINS, ..., 1 quantiles of each column of ``x`` ``[N, F]``
        (at most :data:`MAX_QUANTILE_ROWS` evenly spaced rows of it)."""
        if x.shape[0] == 0:
            return
        if x.shape[0] > MAX_QUANTILE_ROWS:
            x = x[:: math.ceil(x.shape[0] / MAX_QUANTILE_ROWS)]
        x = x.to(self.edges.device, torch.float32)
        q = torch.linspace(0.0, 1.0, self.edges.shape[1], device=x.device)
        cols = [torch.quantile(x[:, j], q) for j in range(x.shape[1])]
        self.edges.copy_(torch.stack(cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``[B, F]`` to ``[B, F * (BINS + 1)]``."""
        left, right = self.edges[:, :-1], self.edges[:, 1:]
        width = (right - left).clamp_min(_MIN_WIDTH)
        through = ((x.unsqueeze(-1) - left) / width).clamp(0.0, 1.0)
        return torch.cat([soft_clip(x).unsqueeze(-1), through], dim=-1).flatten(1)


class PeriodicPiecewiseEmbedding(nn.Module):
    """:class:`PeriodicEmbedding` and :class:`PiecewiseLinearEncoding` side by side:
    ``[B, F]`` to ``[B, F * (DIM + BINS + 1)]``.

    Args:
        in_features: Number of input columns ``F``.
    """

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.periodic = PeriodicEmbedding(in_features)
        self.piecewise = PiecewiseLinearEncoding(in_features)
        self.in_features = in_features
        self.out_features = self.periodic.out_features + self.piecewise.out_features

    def fit_edges(self, x: torch.Tensor) -> None:
        """See :meth:`PiecewiseLinearEncoding.fit_edges`."""
        self.piecewise.fit_edges(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``[B, F]`` to the periodic features, then the piecewise-linear ones."""
        return torch.cat([self.periodic(x), self.piecewise(x)], dim=-1)
