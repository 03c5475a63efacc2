"""A model's training loss: by task, or the model's own (``computes_loss``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.models.spec import TASKS

__all__ = ["compute_loss", "computes_loss", "forward_loss", "unwrap_model"]


def compute_loss(task: str, outputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The mean training loss for ``task``, computed in float32 whatever the autocast dtype.

    Args:
        task: ``classification`` (cross entropy over logits ``[B, K]`` and int64 labels ``[B]``),
            ``regression`` (mean squared error of ``[B, 1]`` or ``[B]`` against float ``[B]``) or
            ``lm`` (cross entropy of logits ``[B, T, V]`` against next tokens ``[B, T]``).
        outputs: What the model returned.
        target: Labels, values or next-token ids.

    Returns:
        A scalar float32 tensor.

    Raises:
        ValueError: On an unknown task.
    """
    if task == "classification":
        return F.cross_entropy(outputs.float(), target)
    if task == "regression":
        pred = outputs.float()
        if pred.dim() == target.dim() + 1 and pred.shape[-1] == 1:
            pred = pred.squeeze(-1)
        return F.mse_loss(pred, target.float())
    if task == "lm":
        logits = outputs.float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    raise ValueError(f"task must be one of {list(TASKS)}, got {task!r}")


def computes_loss(model: nn.Module) -> bool:
    """Whether ``model`` (through its wrappers) returns its own loss given ``targets=``.

    A model opts in with a true ``computes_loss`` attribute (the GPT with ``loss_chunk > 0``,
    the tabular MLP with ``ensemble > 1``): its ``forward(x, targets=y)`` returns the scalar
    mean loss, which it can compute more cheaply than :func:`compute_loss` can from the logits
    (the GPT), or which is not the loss of its prediction (each ensemble member's own loss).
    """
    return getattr(unwrap_model(model), "computes_loss", False) is True


def forward_loss(
    model: nn.Module,
    task: str,
    x: torch.Tensor,
    y: torch.Tensor,
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> torch.Tensor:
    """The training loss of ``model`` on ``(x, y)``: the forward pass and the loss.

    Calls ``model(x, targets=y)`` under ``autocast`` when the model computes its own loss (the
    chunked LM head, which never materialises the logits; the MLP ensemble), else
    ``compute_loss(task, model(x), y)`` with the forward under ``autocast`` and the loss
    outside it, as before.

    Args:
        model: The model or its DDP / torch.compile wrapper (called as given).
        task: The data's task (see :func:`compute_loss`).
        x: Model inputs.
        y: Targets.
        autocast: A factory of the precision context for the forward pass.

    Returns:
        A scalar float32 tensor.
    """
    if computes_loss(model):
        with autocast():
            loss: torch.Tensor = model(x, targets=y)
        return loss
    with autocast():
        out = model(x)
    return compute_loss(task, out, y)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain model inside DDP (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if isinstance(model, nn.parallel.DistributedDataParallel):
            inner = model.module
        if not isinstance(inner, nn.Module):
            return model
        model = inner
