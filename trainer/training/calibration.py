"""Temperature scaling: after training, one scalar fitted on the validation rows makes a
classifier's probabilities honest without changing a single prediction.

Early stopping on a small validation split picks the weights that scored best there, and
those are often overconfident: the right class wins, but with a probability that a few wrong
test rows punish hard in log loss. Dividing the logits by a temperature ``T`` fitted to
minimise the validation log loss (Guo et al. 2017, "On Calibration of Modern Neural
Networks") fixes most of that, and ``argmax(z / T) = argmax(z)`` keeps the accuracy.

The fit runs on the main rank only, after the best weights are back and before the export,
and it is deterministic (a golden-section search on ``log T``, in float64): a rerun from the
last checkpoint fits the same ``T``. The temperature lives in the model's ``temperature``
buffer (:class:`trainer.models.mlp.TabularMLP`), so ``model.safetensors`` carries it; a model
without such a buffer (a plugin) is left as it is.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from trainer.data.datasets import eval_batches
from trainer.models import build_model, unwrap_model
from trainer.training.run import Run

__all__ = ["MAX_TEMPERATURE", "MIN_TEMPERATURE", "calibrate", "fit_temperature", "nll"]

MIN_TEMPERATURE = 1.0
"""Never sharpen: a validation split the model gets all right (tens of rows on a small
table) pulls the fit towards ``T -> 0`` (certainty), which the test rows would punish."""
MAX_TEMPERATURE = 20.0
"""Soften at most 20x."""
_ITERATIONS = 60
"""Golden-section steps: the bracket ``[log 1, log 20]`` shrinks to ~1e-12."""


def nll(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> float:
    """Mean negative log likelihood of ``labels`` under ``softmax(logits / temperature)``."""
    z = logits.double() / temperature
    return float((torch.logsumexp(z, -1) - z.gather(1, labels.view(-1, 1)).squeeze(1)).mean())


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
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    lo, hi = math.log(MIN_TEMPERATURE), math.log(MAX_TEMPERATURE)
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = nll(logits, labels, math.exp(a)), nll(logits, labels, math.exp(b))
    for _ in range(_ITERATIONS):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = nll(logits, labels, math.exp(a))
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = nll(logits, labels, math.exp(b))
    best = math.exp((lo + hi) / 2.0)
    # The ends of the bracket are candidates too (a monotone loss), and so is T = 1.
    candidates = [best, MIN_TEMPERATURE, MAX_TEMPERATURE, 1.0]
    return min(candidates, key=lambda t: (nll(logits, labels, t), abs(math.log(t))))


@torch.no_grad()
def _validation_logits(run: Run, model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's float32 logits and the labels of every validation row (this process only)."""
    assert run.val_ds is not None
    model.eval()
    outs, labels = [], []
    for x, y, n_valid in eval_batches(
        run.val_ds, batch_size=run.cfg.data.eval_batch_size, rank=0, world_size=1
    ):
        outs.append(model(x.to(run.ctx.device)).float()[:n_valid].cpu())
        labels.append(y[:n_valid].long())
    model.train()
    return torch.cat(outs), torch.cat(labels)


def calibrate(run: Run, state: dict[str, torch.Tensor] | None) -> dict[str, float]:
    """Fit the temperature of a trained classifier on the validation rows (main rank only).

    Call it after the exported weights are final: in ``run.raw_model`` (DDP, one process) or,
    under FSDP, in ``state`` (the gathered full state; a plain copy of the model scores it, and
    the temperature is written into ``state``).

    Args:
        run: The finished run.
        state: FSDP's gathered full state on the main rank, else None.

    Returns:
        ``temperature`` and ``val_loss_calibrated`` (the validation log loss of the exported
        model; ``val_loss`` stays the one early stopping and tuning compared) for the model's
        metrics; empty where nothing was fitted: another task, no validation rows,
        ``train.calibrate`` off, a model without a temperature, or a non-main rank.
    """
    if not (
        run.ctx.is_main
        and run.cfg.train.calibrate
        and run.spec.task == "classification"
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
    buffer = getattr(model, "temperature", None)
    if not isinstance(buffer, torch.Tensor) or buffer.numel() != 1:
        return {}
    buffer.fill_(1.0)  # fit from the raw logits, whatever a restored state held
    logits, labels = _validation_logits(run, model)
    temperature = fit_temperature(logits, labels)
    buffer.fill_(temperature)
    if run.sharded and state is not None:
        state["temperature"] = buffer.detach().to("cpu", copy=True)
    return {
        "temperature": temperature,
        "val_loss_calibrated": nll(logits, labels, temperature),
    }
