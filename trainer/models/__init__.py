"""The models: build one by name, its loss, its size and its FLOPs per token.

What other code may use is exported here, each name loaded with its module on first use (so
that reading a model's ``model.json`` or checking a plugin's name imports no torch):

- :mod:`~trainer.models.spec`: :class:`ModelSpec`, what the data tells a model about its shapes;
- :mod:`~trainer.models.registry`: :func:`build_model`, the built-in MLP and GPT or a plugin;
- :mod:`~trainer.models.plugins`: the plugins' allow-list and their guarded import;
- :mod:`~trainer.models.losses`: the training loss by task, or the model's own;
- :mod:`~trainer.models.sizes`: parameter counts and FLOPs per token;
- :mod:`~trainer.models.export`: the model artifact (weights, ``model.json``, metrics).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.base.lazy import lazy_exports

if TYPE_CHECKING:
    from trainer.models.gpt import GPT
    from trainer.models.losses import compute_loss, computes_loss, forward_loss, unwrap_model
    from trainer.models.mlp import TabularMLP
    from trainer.models.plugins import (
        BUILTIN_MODELS,
        plugin_allowed,
        plugin_module,
        validate_plugin_entries,
    )
    from trainer.models.registry import build_model
    from trainer.models.sizes import count_params, flops_per_token
    from trainer.models.spec import ModelSpec, ModelTask

__all__ = [
    "BUILTIN_MODELS",
    "GPT",
    "ModelSpec",
    "ModelTask",
    "TabularMLP",
    "build_model",
    "compute_loss",
    "computes_loss",
    "count_params",
    "flops_per_token",
    "forward_loss",
    "plugin_allowed",
    "plugin_module",
    "unwrap_model",
    "validate_plugin_entries",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "BUILTIN_MODELS": "plugins",
        "GPT": "gpt",
        "ModelSpec": "spec",
        "ModelTask": "spec",
        "TabularMLP": "mlp",
        "build_model": "registry",
        "compute_loss": "losses",
        "computes_loss": "losses",
        "count_params": "sizes",
        "flops_per_token": "sizes",
        "forward_loss": "losses",
        "plugin_allowed": "plugins",
        "plugin_module": "plugins",
        "unwrap_model": "losses",
        "validate_plugin_entries": "plugins",
    },
)
