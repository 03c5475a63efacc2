"""The optimizer and its learning-rate schedule: AdamW with decay on matrices, warmup then decay."""

from __future__ import annotations

import math

import torch

from trainer.config import WorkerConfig


def lr_multiplier(step: int, *, total: int, warmup: int, schedule: str, min_ratio: float) -> float:
    """Learning-rate factor for optimizer step ``step`` (0-based): linear warmup, then decay."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(
    model: torch.nn.Module, cfg: WorkerConfig, device: torch.device
) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only; fused on CUDA unless configured otherwise."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    o = cfg.optim
    fused = o.fused if o.fused is not None else device.type == "cuda"
    groups = [
        {"params": decay, "weight_decay": o.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=fused)
