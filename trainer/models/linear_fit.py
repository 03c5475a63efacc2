"""The tabular MLP's linear path, fitted in closed form before training starts.

A small table whose target is (nearly) linear in its features is where a neural network loses to
a one-line linear model: the network's extra freedom fits noise that the linear model cannot.
The MLP therefore carries a linear path from its inputs to its outputs (a wide-and-deep model)
whose weights :func:`fit_linear` computes from the training rows before the first step, the way
scikit-learn's baselines would: ridge regression (``alpha`` = 1, on the standardised target) or
multinomial logistic regression with an L2 penalty (``C`` = 1), both with an intercept. The
hidden layers' output layer starts at zero, so the untrained model *is* the linear model; training
then learns what the linear model misses, and early stopping (which scores the starting weights
too) never ends worse on the validation rows than the linear fit.

The fit runs on the CPU in float64 over at most :data:`MAX_FIT_ELEMENTS` feature values (rows
evenly strided through the training split when there are more: deterministic, no random draw),
identically on every rank.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["MAX_FIT_ELEMENTS", "MAX_FIT_FEATURES", "LinearFit", "fit_linear"]

log = logging.getLogger(__name__)

MAX_FIT_ELEMENTS = 1 << 24
"""Most feature values (rows x features) the fit reads: 128 MiB in float64."""
MAX_FIT_FEATURES = 4096
"""Widest table fitted (the ridge system is features x features)."""
RIDGE_ALPHA = 1.0
"""Ridge penalty on the sum of squares (scikit-learn's ``Ridge()`` default)."""
LOGISTIC_C = 1.0
"""Inverse L2 strength of the logistic fit (scikit-learn's ``LogisticRegression()`` default)."""
LOGISTIC_MAX_ITER = 200
"""L-BFGS iterations of the logistic fit (scikit-learn's default is 100 at a looser tolerance)."""


@dataclass(frozen=True, slots=True)
class LinearFit:
    """A fitted linear map ``x @ weight.T + bias``, shaped like an ``nn.Linear``'s tensors."""

    weight: torch.Tensor
    """[outputs, features], float64."""
    bias: torch.Tensor
    """[outputs], float64."""
    rows: int
    """Training rows the fit read."""


def fit_rows(n: int, features: int) -> torch.Tensor | None:
    """Row indices the fit reads (``None``: all ``n``), evenly strided to fit the budget."""
    budget = max(MAX_FIT_ELEMENTS // max(features, 1), 1)
    if n <= budget:
        return None
    return torch.arange(0, n, math.ceil(n / budget))


def fit_linear(
    x: torch.Tensor, y: torch.Tensor, *, task: str, num_classes: int | None = None
) -> LinearFit | None:
    """Fit the linear model of ``task`` to features ``x`` [N, F] and target ``y`` [N].

    Args:
        x: Features, as the model sees them.
        y: Class ids (classification) or the target as the model learns it (regression: the
            standardised target).
        task: ``classification`` or ``regression``.
        num_classes: Outputs of a classification model (classes absent from ``y`` get the
            penalty's zero weights and a very low bias).

    Returns:
        The fit, or ``None`` where none is made (no rows, or wider than
        :data:`MAX_FIT_FEATURES`; the reason is logged).
    """
    n, width = x.shape
    if n == 0 or width > MAX_FIT_FEATURES:
        log.info(
            "linear path not fitted (%d rows, %d features; fitted up to %d features)",
            n,
            width,
            MAX_FIT_FEATURES,
        )
        return None
    rows = fit_rows(n, width)
    if rows is not None:
        x, y = x.index_select(0, rows), y.index_select(0, rows)
    x = x.detach().to("cpu", torch.float64)
    if task == "regression":
        weight, bias = _ridge(x, y.detach().to("cpu", torch.float64))
    else:
        assert num_classes is not None, "classification needs num_classes"
        weight, bias = _logistic(x, y.detach().to("cpu", torch.long), num_classes)
    return LinearFit(weight=weight, bias=bias, rows=x.shape[0])


def _ridge(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ridge regression with an unpenalised intercept: centre, then the normal equations."""
    x_mean, y_mean = x.mean(0), y.mean()
    xc = x - x_mean
    gram = xc.T @ xc + RIDGE_ALPHA * torch.eye(x.shape[1], dtype=x.dtype)
    w = torch.linalg.solve(gram, xc.T @ (y - y_mean))
    return w.unsqueeze(0), (y_mean - x_mean @ w).reshape(1)


def _logistic(x: torch.Tensor, y: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Multinomial logistic regression, L2 on the weights (not the intercept), by L-BFGS."""
    n, width = x.shape
    w = torch.zeros(k, width, dtype=x.dtype, requires_grad=True)
    b = torch.zeros(k, dtype=x.dtype, requires_grad=True)
    # scikit-learn minimises C * sum(loss) + |W|^2 / 2; per row: mean(loss) + |W|^2 / (2 C n).
    # With two classes it fits one weight vector w, the difference of our two rows; at the
    # optimum they are +-w/2, whose squares sum to |w|^2 / 2: twice the penalty matches.
    penalty = (2.0 if k == 2 else 1.0) / (2.0 * LOGISTIC_C * n)
    opt = torch.optim.LBFGS(
        [w, b],
        lr=1.0,
        max_iter=LOGISTIC_MAX_ITER,
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(x @ w.T + b, y) + penalty * (w * w).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return w.detach(), b.detach()
