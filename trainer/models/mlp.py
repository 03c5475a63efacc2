"""A multilayer perceptron for tabular classification and regression."""

from __future__ import annotations

import torch
from torch import nn

from trainer.models.embeddings import PeriodicEmbedding
from trainer.models.linear_fit import LinearFit

_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


class TabularMLP(nn.Module):
    """Stacks of ``Linear -> activation -> Dropout`` followed by a linear head.

    With ``num_layers=0`` the model is a plain linear (logistic or least-squares) model. With
    ``linear=True`` (and hidden layers) a linear path from the inputs is added to the head's
    output (a wide-and-deep model); :meth:`start_from_linear` sets it from a closed-form fit.
    Weights use PyTorch's default ``nn.Linear`` initialisation, drawn from the global generator,
    so the same ``torch.manual_seed`` gives the same model.

    Args:
        in_features: Number of input features.
        out_features: Number of classes for classification, 1 for regression.
        hidden_dim: Width of each hidden layer.
        num_layers: Number of hidden layers.
        dropout: Dropout probability after each hidden activation.
        activation: ``relu``, ``gelu`` or ``silu``.
        linear: Add the linear path (ignored without hidden layers: the model is linear).
        embedding: ``periodic``: the hidden layers read each input through a
            :class:`~trainer.models.embeddings.PeriodicEmbedding` (the linear path reads the
            inputs as they are); ``none``: the inputs as they are (ignored without hidden layers).

    Raises:
        ValueError: On a non-positive size or an unknown activation.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        hidden_dim: int = 128,
        num_layers: int = 2,
        dropout: float = 0.0,
        activation: str = "gelu",
        linear: bool = False,
        embedding: str = "none",
    ) -> None:
        super().__init__()
        if in_features <= 0 or out_features <= 0 or hidden_dim <= 0 or num_layers < 0:
            raise ValueError(
                f"TabularMLP sizes must be positive, got in_features={in_features}, "
                f"out_features={out_features}, hidden_dim={hidden_dim}, num_layers={num_layers}"
            )
        if activation not in _ACTIVATIONS:
            raise ValueError(
                f"model.activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}"
            )
        if embedding not in ("none", "periodic"):
            raise ValueError(f"model.embedding must be 'periodic' or 'none', got {embedding!r}")
        self.embed = (
            PeriodicEmbedding(in_features) if embedding == "periodic" and num_layers else None
        )
        layers: list[nn.Module] = []
        width = in_features if self.embed is None else self.embed.out_features
        for _ in range(num_layers):
            layers += [
                nn.Linear(width, hidden_dim),
                _ACTIVATIONS[activation](),
                nn.Dropout(dropout),
            ]
            width = hidden_dim
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, out_features)
        self.linear = nn.Linear(in_features, out_features) if linear and num_layers else None
        self.in_features = in_features
        self.out_features = out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map float features ``[B, in_features]`` to outputs ``[B, out_features]``."""
        out = self.head(self.body(x if self.embed is None else self.embed(x)))
        return out if self.linear is None else out + self.linear(x)

    @torch.no_grad()
    def start_from_linear(self, fit: LinearFit) -> None:
        """Start as the linear model ``fit``: the linear path (or, without hidden layers, the
        head) takes its weights and the head of the hidden layers starts at zero.

        Every weight stays trainable: training may move the linear part too (keeping it fixed
        scored worse on the tables of ``benchmarks/default_models.py``).

        Args:
            fit: The closed-form fit (see :mod:`trainer.models.linear_fit`).
        """
        target = self.linear if self.linear is not None else self.head
        target.weight.copy_(fit.weight)
        target.bias.copy_(fit.bias)
        if self.linear is not None:
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)
