"""Scoring a run on its validation rows, and early stopping on the score.

:func:`evaluate` is a collective (under FSDP every rank runs every forward); the main rank
keeps the best weights that :func:`early_stop_update` finds, for the export and for checkpoints
(:class:`trainer.training.state.BestWeights`).
"""

from __future__ import annotations

import math

import torch

from trainer.data.datasets import eval_batches
from trainer.distributed import dist
from trainer.models import compute_loss
from trainer.training.run import Run


@torch.no_grad()
def evaluate(run: Run) -> dict[str, float]:
    """Loss (and accuracy or RMSE) over every validation row, summed over ranks."""
    if run.val_ds is None:
        return {}
    run.raw_model.eval()
    ctx = run.ctx
    totals = torch.zeros(3, dtype=torch.float64, device=ctx.device)  # loss, correct, n
    for x, y, n_valid in eval_batches(
        run.val_ds,
        batch_size=run.cfg.data.eval_batch_size,
        rank=ctx.rank,
        world_size=ctx.world_size,
    ):
        # Every rank runs every (padded) batch: an FSDP forward is a collective.
        with run.precision.autocast():
            out = run.raw_model(x.to(ctx.device))
        if n_valid == 0:
            continue
        out = out[:n_valid].float()
        y = run.scaled_target(y[:n_valid].to(ctx.device))
        task = run.spec.task
        per = compute_loss(task, out, y) * n_valid
        totals[0] += per.double()
        if task == "classification":
            totals[1] += (out.argmax(-1) == y).sum().double()
        elif task == "regression":
            totals[1] += ((out.squeeze(-1) - y) ** 2).sum().double()
        totals[2] += n_valid
    run.raw_model.train()
    loss_sum, extra, n = dist.all_reduce_sum(ctx, totals).tolist()
    n = max(n, 1.0)
    metrics = {"val_loss": loss_sum / n}
    if run.spec.task == "classification":
        metrics["val_accuracy"] = extra / n
    elif run.spec.task == "regression":
        metrics["val_rmse"] = math.sqrt(extra / n) * run.target_std
    else:
        metrics["val_perplexity"] = math.exp(min(loss_sum / n, 50.0))
    return metrics


def early_stop_update(run: Run, metrics: dict[str, float]) -> bool:
    """Track the best value; keep the best weights; return True when patience is used up."""
    es = run.cfg.train.early_stopping
    if es is None:
        return False
    if es.metric not in metrics:
        raise ValueError(
            f"train.early_stopping.metric {es.metric!r} is not produced for this "
            f"task; available: {sorted(metrics)}"
        )
    value, s = metrics[es.metric], run.state
    better = s.best is None or (
        value < s.best - es.min_delta if es.mode == "min" else value > s.best + es.min_delta
    )
    if better:
        s.best, s.evals_without_improvement = value, 0
        s.best_metrics = {k: v for k, v in metrics.items() if k.startswith("val_")}
        best = run.full_state()  # a collective under FSDP
        if run.ctx.is_main:
            run.best.weights = best
        return False
    s.evals_without_improvement += 1
    return s.evals_without_improvement >= es.patience
