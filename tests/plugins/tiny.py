"""A tiny user model for the registry's ``package.module:build`` plugin path."""

from __future__ import annotations

from typing import Any

from torch import nn


def build(cfg: Any, spec: Any) -> nn.Module:
    """A linear model sized from the spec; ``cfg.options["bias"]`` toggles the bias."""
    out = spec.num_classes if spec.task == "classification" else 1
    return nn.Linear(spec.in_features, out, bias=cfg.options.get("bias", True))


def not_a_module(cfg: Any, spec: Any) -> object:
    """A broken plugin: returns something that is not an ``nn.Module``."""
    return 42


NOT_CALLABLE = "just a string"
