"""Calibration: after training, two scalars fitted on the validation rows make the exported
model's predictions honest: a temperature for a classifier's probabilities, and the share of
the linear fit mixed into the network's predictions.

Early stopping on a small validation split picks the weights that scored best there, and
those are often overconfident: the right class wins, but with a probability that a few wrong
test rows punish hard in log loss. Dividing the logits by a temperature ``T`` fitted to
minimise the validation log loss (Guo et al. 2017, "On Calibration of Modern Neural
Networks") fixes most of that, and ``argmax(z / T) = argmax(z)`` keeps the accuracy.

On a small table whose signal is (nearly) linear, the network's extra freedom also fits noise
that the plain linear model cannot: a mix ``(1 - s) p_net + s p_linear`` (probabilities, or
values for regression) of the two, with ``s`` fitted on the validation rows, then scores
better on new rows than either alone (a two-model stacking; on a large table ``s`` goes to 0).
The linear model is the fit the network started from (``model.linear: fit``), kept apart in
the model's ``anchor_*`` buffers. The temperature is fitted first, then ``s``.

The fits run on the main rank only, after the best weights are back and before the export,
and they are deterministic (golden-section searches in float64, a closed form for
regression): a rerun from the last checkpoint fits the same values. They live in the model's
``temperature`` and ``anchor_share`` buffers (:class:`trainer.models.mlp.TabularMLP`), so
``model.safetensors`` carries them; a model without such buffers (a plugin) is left as it is.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from trainer.data.datasets import eval_batches
from trainer.models import TabularMLP, build_model, unwrap_model
from trainer.training.run import Run

__all__ = [
    "MAX_TEMPERATURE",
    "MIN_TEMPERATURE",
    "SHARE_PRIOR",
    "calibrate",
    "fit_share",
    "fit_temperature",
    "nll",
]

MIN_TEMPERATURE = 1.0
"""Never sharpen: a validation split the model gets all right (tens of rows on a small
table) pulls the fit towards ``T -> 0`` (certainty), which the test rows would punish."""
MAX_TEMPERATURE = 20.0
"""Soften at most 20x."""
SHARE_PRIOR = 1.0
"""Pseudo-rows of the Beta prior on a classifier's share of the linear model (Beta(2, 2): an
even mix when the validation rows cannot tell the two models apart)."""
_ITERATIONS = 60
"""Golden-section steps: the bracket ``[log 1, log 20]`` shrinks to ~1e-12."""


def nll(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> float:
    """Mean negative log likelihood of ``labels`` under ``softmax(logits / temperature)``."""
    z = logits.double() / temperature
    return float((torch.logsumexp(z, -1) - z.gather(1, labels.view(-1, 1)).squeeze(1)).mean())


def _golden_min(f: Callable[[float], float], lo: float, hi: float) -> float:
    """The minimiser of a unimodal ``f`` on ``[lo, hi]`` (the ends are candidates too)."""
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    left, right = lo, hi
    a, b = right - ratio * (right - left), left + ratio * (right - left)
    fa, fb = f(a), f(b)
    for _ in range(_ITERATIONS):
        if fa <= fb:
            right, b, fb = b, a, fa
            a = right - ratio * (right - left)
            fa = f(a)
        else:
            left, a, fa = a, b, fb
            b = left + ratio * (right - left)
            fb = f(b)
    return min([(left + right) / 2.0, lo, hi], key=f)


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The temperature in ``[MIN_TEMPERATURE, MAX_TEMPERATURE]`` that minimises :func:`nll`.

    The log loss is convex in ``1 / T``, so it has one minimum along ``log T``: a
    golden-section search finds it without gradients or randomness.

    Args:
        logits: ``[N, K]`` logits of the validation rows.
        labels: ``[N]`` int64 classes.

    Returns:
        The temperature (1.0 for no rows).
    """
    if logits.shape[0] == 0:
        return 1.0
    best = math.exp(
        _golden_min(
            lambda t: nll(logits, labels, math.exp(t)),
            math.log(MIN_TEMPERATURE),
            math.log(MAX_TEMPERATURE),
        )
    )
    # T = 1 is a candidate too, preferred on a tie.
    return min([best, 1.0], key=lambda t: (nll(logits, labels, t), abs(math.log(t))))


def mixed_loss(
    out: torch.Tensor, anchor: torch.Tensor, target: torch.Tensor, share: float, regression: bool
) -> float:
    """Validation loss of ``(1 - share) * net + share * linear``: the mean log loss of the mixed
    probabilities (``out`` and ``anchor`` are logits), or the mean squared error of the mixed
    values."""
    if regression:
        mixed = (1.0 - share) * out.double() + share * anchor.double()
        return float(((mixed.reshape(-1) - target.double().reshape(-1)) ** 2).mean())
    p = (1.0 - share) * torch.softmax(out.double(), -1) + share * torch.softmax(anchor.double(), -1)
    picked = p.gather(1, target.long().view(-1, 1)).squeeze(1)
    return float(-torch.log(picked.clamp_min(1e-300)).mean())


def fit_share(
    out: torch.Tensor, anchor: torch.Tensor, target: torch.Tensor, regression: bool
) -> float:
    """The share ``s`` in ``[0, 1]`` of the linear model in the mix.

    Regression: the ``s`` that minimises the squared error of the mix (:func:`mixed_loss`), the
    vertex of a parabola; ``s = 0`` (the network alone) wins ties.

    Classification: the most probable ``s`` under a Beta(:data:`SHARE_PRIOR` + 1, same)
    prior, i.e. the minimiser of ``mixed_loss(s) - SHARE_PRIOR * log(s (1 - s)) / N`` over
    the ``N`` validation rows. The log loss alone is flat where both models get every
    validation row right with confidence (a small table's few dozen rows, often): it would
    keep whichever is more certain, and the network, trained until its validation loss is
    near 0, is the one that pays for a certain mistake on new rows. The prior settles such a
    flat loss on an even mix, and weighs as much as :data:`SHARE_PRIOR` rows: a few hundred
    validation rows that prefer one model outvote it. The objective is convex, so a
    golden-section search finds its one minimum.

    Args:
        out: ``[N, K]`` logits or ``[N, 1]`` values of the (calibrated) network.
        anchor: The linear model's, shaped like ``out``.
        target: ``[N]`` classes, or values in the units ``out`` predicts.
        regression: Values rather than logits.

    Returns:
        The share (0.0 for no rows).
    """
    rows = out.shape[0]
    if rows == 0:
        return 0.0
    if regression:
        net, gap = out.double().reshape(-1), (anchor.double() - out.double()).reshape(-1)
        denom = float((gap * gap).sum())
        best = 0.0 if denom == 0.0 else float(-((net - target.double()) * gap).sum()) / denom
        best = min(max(best, 0.0), 1.0)
        return min([best, 0.0], key=lambda v: (mixed_loss(out, anchor, target, v, True), v))

    def posterior(v: float) -> float:
        if not 0.0 < v < 1.0:
            return math.inf
        return (
            mixed_loss(out, anchor, target, v, False) - SHARE_PRIOR * math.log(v * (1 - v)) / rows
        )

    return _golden_min(posterior, 0.0, 1.0)


@torch.no_grad()
def _validation_outputs(
    run: Run, model: nn.Module, anchor: Callable[[torch.Tensor], torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The model's float32 outputs, the ``anchor``'s and the targets (classes, or values scaled
    as the model learns them) of every validation row (this process only)."""
    assert run.val_ds is not None
    model.eval()
    outs, anchors, targets = [], [], []
    for x, y, n_valid in eval_batches(
        run.val_ds, batch_size=run.cfg.data.eval_batch_size, rank=0, world_size=1
    ):
        x = x.to(run.ctx.device)
        outs.append(model(x).float()[:n_valid].cpu())
        if anchor is not None:
            anchors.append(anchor(x).float()[:n_valid].cpu())
        y = y[:n_valid]
        targets.append(y.long() if run.spec.task == "classification" else run.scaled_target(y))
    model.train()
    return torch.cat(outs), torch.cat(anchors) if anchors else None, torch.cat(targets)


def _scalar_buffer(model: nn.Module, name: str) -> torch.Tensor | None:
    buffer = getattr(model, name, None)
    return buffer if isinstance(buffer, torch.Tensor) and buffer.numel() == 1 else None


def calibrate(run: Run, state: dict[str, torch.Tensor] | None) -> dict[str, float]:
    """Fit a classifier's temperature, then the share of the linear fit, on the validation rows
    (main rank only).

    Call it after the exported weights are final: in ``run.raw_model`` (DDP, one process) or,
    under FSDP, in ``state`` (the gathered full state; a plain copy of the model scores it, and
    the fitted values are written into ``state``).

    Args:
        run: The finished run.
        state: FSDP's gathered full state on the main rank, else None.

    Returns:
        For the model's metrics: ``temperature`` (classification), ``linear_share`` (a model
        that started from the linear fit) and ``val_loss_calibrated`` (the validation loss of
        the exported model; ``val_loss`` stays the one early stopping and tuning compared);
        empty where nothing was fitted: no validation rows, ``train.calibrate`` off, a model
        without these buffers, or a non-main rank.
    """
    if not (
        run.ctx.is_main
        and run.cfg.train.calibrate
        and run.spec.task in ("classification", "regression")
        and run.val_ds is not None
        and len(run.val_ds) > 0
    ):
        return {}
    model = unwrap_model(run.raw_model)
    if run.sharded:
        if state is None:
            return {}
        with torch.random.fork_rng(devices=[]):  # building draws weights: keep the stream
            model = build_model(run.cfg.model, run.spec)
        model.load_state_dict(state)
        model.to(run.ctx.device)
    regression = run.spec.task == "regression"
    temperature = None if regression else _scalar_buffer(model, "temperature")
    mlp = model if isinstance(model, TabularMLP) and run.linear_fitted else None
    share = None if mlp is None else mlp.anchor_share
    if temperature is None and share is None:
        return {}
    # Fit from the raw outputs, whatever a restored state held.
    fitted: dict[str, float] = {}
    if temperature is not None:
        temperature.fill_(1.0)
    if share is not None:
        share.fill_(0.0)
    out, anchor, target = _validation_outputs(
        run, model, None if mlp is None or share is None else mlp.anchor
    )
    if temperature is not None:
        fitted["temperature"] = fit_temperature(out, target)
        temperature.fill_(fitted["temperature"])
        out = out / fitted["temperature"]
    if share is not None:
        assert anchor is not None
        fitted["linear_share"] = fit_share(out, anchor, target, regression)
        share.fill_(fitted["linear_share"])
    fitted["val_loss_calibrated"] = mixed_loss(
        out, out if anchor is None else anchor, target, fitted.get("linear_share", 0.0), regression
    )
    if run.sharded and state is not None:
        for name, buffer in (("temperature", temperature), ("anchor_share", share)):
            if buffer is not None:
                state[name] = buffer.detach().to("cpu", copy=True)
    return fitted
