"""The model registry: build a model by name, its loss, its size and its FLOPs per token."""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config import ModelConfig
from trainer.models.gpt import GPT
from trainer.models.mlp import TabularMLP

ModelTask = Literal["classification", "regression", "lm"]
_TASKS: tuple[str, ...] = get_args(ModelTask)

__all__ = [
    "GPT",
    "ModelSpec",
    "ModelTask",
    "TabularMLP",
    "build_model",
    "compute_loss",
    "count_params",
    "flops_per_token",
    "unwrap_model",
]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What the data tells the model about its shapes; recorded in ``model.json``.

    Raises:
        ValueError: On an unknown task, a non-positive size, or a size the task needs but lacks.
    """

    task: ModelTask
    """``classification`` and ``regression`` (tabular) or ``lm`` (token sequences)."""
    in_features: int | None = None
    """Tabular: number of feature columns."""
    num_classes: int | None = None
    """Classification: number of classes (labels are ``0 .. num_classes - 1``)."""
    seq_len: int | None = None
    """Language modelling: tokens per sequence (the GPT block size)."""

    def __post_init__(self) -> None:
        if self.task not in _TASKS:
            raise ValueError(f"spec.task must be one of {list(_TASKS)}, got {self.task!r}")
        for name in ("in_features", "num_classes", "seq_len"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value <= 0
            ):
                raise ValueError(f"spec.{name} must be a positive integer or null, got {value!r}")
        if self.task in ("classification", "regression") and self.in_features is None:
            raise ValueError(f"spec.in_features must be set for task {self.task!r}")
        if self.task == "classification" and (self.num_classes is None or self.num_classes < 2):
            raise ValueError(
                f"spec.num_classes must be >= 2 for task 'classification', got {self.num_classes!r}"
            )
        if self.task == "lm" and self.seq_len is None:
            raise ValueError("spec.seq_len must be set for task 'lm'")

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (round-trips through ``from_dict``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        """Rebuild a spec from ``to_dict`` output.

        Raises:
            ValueError: If ``d`` is not a mapping, has unknown keys, or describes an invalid spec.
        """
        if not isinstance(d, dict):
            raise ValueError(f"spec must be a mapping, got {d!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown spec key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        if "task" not in d:
            raise ValueError("missing spec key 'task'")
        return cls(**d)


def _check(ok: bool, cfg: ModelConfig, message: str) -> None:
    if not ok:
        raise ValueError(f"model.name {cfg.name!r} {message}")


def _build_plugin(cfg: ModelConfig, spec: ModelSpec) -> nn.Module:
    """Import ``package.module:func`` from the environment and call ``func(cfg, spec)``."""
    module_name, _, attr = cfg.name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"model.name {cfg.name!r}: cannot import {module_name} ({e})") from e
    try:
        factory = getattr(module, attr)
    except AttributeError as e:
        raise ValueError(
            f"model.name {cfg.name!r}: module {module_name} has no attribute {attr!r}"
        ) from e
    if not callable(factory):
        raise ValueError(f"model.name {cfg.name!r}: {module_name}.{attr} is not callable")
    model = factory(cfg, spec)
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"model.name {cfg.name!r}: {module_name}.{attr}(cfg, spec) must return a "
            f"torch.nn.Module, got {type(model).__name__}"
        )
    return model


def build_model(cfg: ModelConfig, spec: ModelSpec) -> nn.Module:
    """Build the model that ``cfg`` names for data described by ``spec``.

    ``mlp`` builds a :class:`TabularMLP` (classification or regression), ``gpt`` a :class:`GPT`
    (``lm``; ``spec.seq_len`` is its block size), and ``package.module:func`` imports ``func``
    from the running environment and returns ``func(cfg, spec)``; ``cfg.options`` carries the
    plugin's own settings. Weights are drawn from the global generator: seed before building.

    Args:
        cfg: The model section of the config.
        spec: Shapes and task of the data.

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
        )
    return _build_plugin(cfg, spec)


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
    raise ValueError(f"task must be one of {list(_TASKS)}, got {task!r}")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain model inside DDP (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if isinstance(model, nn.parallel.DistributedDataParallel):
            inner = model.module
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def count_params(model: nn.Module, *, exclude_embeddings: bool = False) -> int:
    """Number of distinct parameters (a tied weight counts once).

    Args:
        model: The model (DDP and torch.compile wrappers are looked through).
        exclude_embeddings: Leave out weights used only for embedding lookups. Following
            nanoGPT, a token embedding tied to the output head *stays in*: the head is a real
            matmul of ``2 * V * d`` FLOPs per token, so it belongs in ``6N``. For the GPT this
            removes just the position embedding.

    Returns:
        The parameter count.
    """
    model = unwrap_model(model)
    lookup_only: set[int] = set()
    if exclude_embeddings:
        embedding = {
            id(p)
            for m in model.modules()
            if isinstance(m, nn.Embedding)
            for p in m.parameters(recurse=False)
        }
        elsewhere = {
            id(p)
            for m in model.modules()
            if not isinstance(m, nn.Embedding)
            for p in m.parameters(recurse=False)
        }
        lookup_only = embedding - elsewhere
    return sum(p.numel() for p in model.parameters() if id(p) not in lookup_only)


def flops_per_token(cfg: ModelConfig, spec: ModelSpec, n_params: int) -> float:
    """Training FLOPs (forward and backward) per token, for MFU.

    GPT: ``6 N + 12 L H Q T`` (PaLM, appendix B) with ``L`` layers, ``H`` heads, head size
    ``Q``, sequence length ``T``; the second term is attention's score and value matmuls, which
    no weight accounts for. Every other model: ``6 N`` per sample (a "token" is a row).

    Args:
        cfg: The model section of the config.
        spec: Shapes of the data (``seq_len`` for the GPT).
        n_params: ``N``; pass ``count_params(model, exclude_embeddings=True)`` (position
            embeddings are lookups, not matmuls; the tied token embedding is the output head).

    Returns:
        FLOPs per token (per row for tabular models).
    """
    flops = 6.0 * n_params
    if cfg.name == "gpt" and spec.seq_len is not None:
        head_dim = cfg.d_model // cfg.n_head
        flops += 12.0 * cfg.n_layer * cfg.n_head * head_dim * spec.seq_len
    return flops
