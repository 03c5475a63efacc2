"""A multilayer perceptron for tabular classification and regression."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.models.embeddings import PeriodicEmbedding, PeriodicPiecewiseEmbedding
from trainer.models.linear_fit import LinearFit

_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}
_EMBEDDINGS: dict[str, type[PeriodicEmbedding | PeriodicPiecewiseEmbedding] | None] = {
    "none": None,
    "periodic": PeriodicEmbedding,
    "periodic+ple": PeriodicPiecewiseEmbedding,
}


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
            :class:`~trainer.models.embeddings.PeriodicEmbedding`; ``periodic+ple``: through
            that and a piecewise-linear encoding whose bins :meth:`fit_embedding` cuts at
            quantiles of the training rows (the linear path reads the
            inputs as they are); ``none``: the inputs as they are (ignored without hidden layers).
        ensemble: ``k`` > 1 makes the hidden layers an ensemble of ``k`` MLPs in one (TabM-mini,
            Gorishniy et al. 2024): each member scales the first layer's input by its own
            vector of random signs and has its own head; the layers between are shared. Each
            member is trained on its own loss (``forward(x, targets=y)``); predictions average
            the members (probabilities for classification).

    Classification models carry a ``temperature`` buffer (1 until
    :mod:`trainer.training.calibration` fits it on the validation rows after training): the
    predicted logits are divided by it, which changes the probabilities and never the argmax.
    It travels in the state dict, so checkpoints, ``model.safetensors`` and every reader of the
    model's outputs see it; a state dict saved before it existed loads with 1.

    A model with the linear path also keeps the linear fit it started from (``anchor_weight``,
    ``anchor_bias``: buffers, never trained) and ``anchor_share``, the share of the anchor's
    predictions mixed into the network's (0 until calibration fits it on the validation rows):
    on a small table whose signal is linear, the network's extra freedom fits noise, and a mix
    with the plain linear model scores better on rows it has not seen than either alone.

    Raises:
        ValueError: On a non-positive size or an unknown activation.
    """

    temperature: torch.Tensor | None
    anchor_share: torch.Tensor | None
    anchor_weight: torch.Tensor
    anchor_bias: torch.Tensor

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
        ensemble: int = 1,
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
        if ensemble < 1:
            raise ValueError(f"model.ensemble must be >= 1, got {ensemble}")
        if embedding not in _EMBEDDINGS:
            raise ValueError(
                f"model.embedding must be one of {list(_EMBEDDINGS)}, got {embedding!r}"
            )
        kind = _EMBEDDINGS[embedding]
        self.embed = kind(in_features) if kind is not None and num_layers else None
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
        self.k = ensemble if num_layers else 1
        self.head = nn.Linear(width, out_features) if self.k == 1 else None
        self.linear = nn.Linear(in_features, out_features) if linear and num_layers else None
        self.in_features = in_features
        self.out_features = out_features
        self.adapter: nn.Parameter | None = None
        self.heads: nn.Parameter | None = None
        self.head_biases: nn.Parameter | None = None
        if self.k > 1:
            first = in_features if self.embed is None else self.embed.out_features
            signs = torch.randint(0, 2, (self.k, first)).float() * 2 - 1
            self.adapter = nn.Parameter(signs)
            bound = 1.0 / math.sqrt(width)
            shape = (self.k, width, out_features)
            self.heads = nn.Parameter(torch.empty(shape).uniform_(-bound, bound))
            biases = torch.empty(self.k, out_features).uniform_(-bound, bound)
            self.head_biases = nn.Parameter(biases)
        self.computes_loss = self.k > 1
        self.regression = out_features == 1
        if self.regression:
            self.temperature = None
        else:
            self.register_buffer("temperature", torch.ones(()))
        if self.linear is None:
            self.anchor_share = None
        else:
            # The linear fit as it was before training, kept apart from the trainable path.
            self.register_buffer("anchor_weight", torch.zeros(out_features, in_features))
            self.register_buffer("anchor_bias", torch.zeros(out_features))
            self.register_buffer("anchor_share", torch.zeros(()))

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        # Models and checkpoints saved before calibration existed have no temperature (1) and
        # no linear anchor (a share of 0: the anchor is never read).
        defaults = {"temperature": torch.ones_like} if self.temperature is not None else {}
        if self.anchor_share is not None:
            defaults |= dict.fromkeys(
                ("anchor_weight", "anchor_bias", "anchor_share"), torch.zeros_like
            )
        for name, fill in defaults.items():
            if prefix + name not in state_dict:
                state_dict[prefix + name] = fill(getattr(self, name))
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def members(self, x: torch.Tensor) -> torch.Tensor:
        """Each member's outputs ``[B, k, out_features]`` (``k`` = 1 without an ensemble)."""
        h = x if self.embed is None else self.embed(x)
        if self.head is not None:
            out = self.head(self.body(h)).unsqueeze(1)
        else:
            assert self.adapter is not None and self.heads is not None
            assert self.head_biases is not None
            h = self.body(h.unsqueeze(1) * self.adapter)
            out = torch.einsum("bkh,kho->bko", h, self.heads) + self.head_biases
        return out if self.linear is None else out + self.linear(x).unsqueeze(1)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Map float features ``[B, in_features]`` to outputs ``[B, out_features]``; given
        ``targets``, the mean over the members of each member's loss (cross entropy over
        logits, or squared error) instead."""
        out = self.members(x)
        if targets is not None:
            out = out.float()
            if self.regression:
                return F.mse_loss(out.squeeze(-1), targets.float().unsqueeze(1).expand(-1, self.k))
            return F.cross_entropy(out.flatten(0, 1), targets.repeat_interleave(self.k))
        if self.k == 1:
            logits = out.squeeze(1)
        elif self.regression:
            logits = out.mean(1)
        else:
            # log of the mean probability: its softmax is the members' mean probabilities
            logits = torch.logsumexp(F.log_softmax(out.float(), -1), 1) - math.log(self.k)
        if self.temperature is not None:
            logits = logits / self.temperature.to(logits.dtype)
        if self.anchor_share is None or not bool(self.anchor_share > 0):
            return logits
        return self.blend(logits, self.anchor(x), self.anchor_share)

    def anchor(self, x: torch.Tensor) -> torch.Tensor:
        """The linear fit's outputs ``[B, out_features]`` (float32), as it was before training."""
        assert self.anchor_share is not None, "a model without a linear path has no anchor"
        return F.linear(x.float(), self.anchor_weight.float(), self.anchor_bias.float())

    def blend(self, out: torch.Tensor, anchor: torch.Tensor, share: torch.Tensor) -> torch.Tensor:
        """Mix the network's outputs with the anchor's: ``(1 - share) p + share p_linear`` in
        probabilities (returned as log probabilities, which are logits), or in values."""
        share = share.float()
        if self.regression:
            return (1 - share) * out.float() + share * anchor
        parts = torch.stack(
            (
                F.log_softmax(out.float(), -1) + torch.log1p(-share),
                F.log_softmax(anchor, -1) + torch.log(share),
            )
        )
        return torch.logsumexp(parts, 0)

    def fit_embedding(self, x: torch.Tensor) -> bool:
        """Cut the piecewise-linear bins at quantiles of the training features ``x`` ``[N, F]``;
        False where the embedding has no bins."""
        if not isinstance(self.embed, PeriodicPiecewiseEmbedding):
            return False
        self.embed.fit_edges(x)
        return True

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
        assert target is not None  # without hidden layers there is one head and no ensemble
        target.weight.copy_(fit.weight)
        target.bias.copy_(fit.bias)
        if self.anchor_share is not None:
            self.anchor_weight.copy_(fit.weight)
            self.anchor_bias.copy_(fit.bias)
        if self.linear is not None:
            if self.head is not None:
                heads = [self.head.weight, self.head.bias]
            else:
                assert self.heads is not None and self.head_biases is not None
                heads = [self.heads, self.head_biases]
            for p in heads:
                nn.init.zeros_(p)
