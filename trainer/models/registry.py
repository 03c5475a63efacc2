"""Build a model by name: the built-in MLP and GPT, or a plugin (:mod:`trainer.models.plugins`)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from trainer.config import ModelConfig
from trainer.models.gpt import GPT
from trainer.models.mlp import TabularMLP
from trainer.models.plugins import build_plugin
from trainer.models.spec import ModelSpec

__all__ = ["build_model"]


def _check(ok: bool, cfg: ModelConfig, message: str) -> None:
    if not ok:
        raise ValueError(f"model.name {cfg.name!r} {message}")


def build_model(
    cfg: ModelConfig, spec: ModelSpec, *, untrusted_dirs: Sequence[str] | None = None
) -> nn.Module:
    """Build the model that ``cfg`` names for data described by ``spec``.

    ``mlp`` builds a :class:`TabularMLP` (classification or regression), ``gpt`` a :class:`GPT`
    (``lm``; ``spec.seq_len`` is its block size), and ``package.module:func`` imports ``func``
    from the running environment and returns ``func(cfg, spec)``; ``cfg.options`` carries the
    plugin's own settings. Weights are drawn from the global generator: seed before building.

    Args:
        cfg: The model section of the config.
        spec: Shapes and task of the data.
        untrusted_dirs: ``None`` when the caller's own config named the model (training): the
            plugin is imported as Python would. Otherwise (a model read from an artifact) the
            plugin is imported from the installed environment only: never from the working
            directory nor from these folders (the artifact's own).

    Returns:
        The model, on the CPU, in training mode.

    Raises:
        ValueError: If the model does not suit the task, the plugin cannot be imported or does
            not return an ``nn.Module``.
    """
    if cfg.name == "mlp":
        _check(
            spec.task in ("classification", "regression"),
            cfg,
            f"needs a tabular task (classification or regression), got task {spec.task!r}",
        )
        assert spec.in_features is not None  # ModelSpec guarantees it for tabular tasks
        out = spec.num_classes if spec.task == "classification" else 1
        assert out is not None
        return TabularMLP(
            in_features=spec.in_features,
            out_features=out,
            hidden_dim=cfg.hidden_dim,
            num_layers=cfg.num_layers,
            dropout=cfg.dropout,
            activation=cfg.activation,
            linear=cfg.linear != "none",
            embedding=cfg.embedding,
            ensemble=cfg.ensemble,
        )
    if cfg.name == "gpt":
        _check(spec.task == "lm", cfg, f"needs task 'lm' (token data), got task {spec.task!r}")
        assert spec.seq_len is not None  # ModelSpec guarantees it for lm
        return GPT(
            vocab_size=cfg.vocab_size,
            block_size=spec.seq_len,
            n_layer=cfg.n_layer,
            n_head=cfg.n_head,
            d_model=cfg.d_model,
            dropout=cfg.dropout,
            activation_checkpointing=cfg.activation_checkpointing,
            loss_chunk=cfg.loss_chunk,
        )
    return build_plugin(cfg, spec, untrusted_dirs)
