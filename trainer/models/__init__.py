"""The model registry: build a model by name, its loss, its size and its FLOPs per token."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config import ModelConfig
from trainer.models.gpt import GPT
from trainer.models.mlp import TabularMLP

ModelTask = Literal["classification", "regression", "lm"]
_TASKS: tuple[str, ...] = get_args(ModelTask)

BUILTIN_MODELS = ("mlp", "gpt")
"""Model names that need no import: always loadable from an artifact."""
_PLUGIN_ENTRY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*)?$")

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


def plugin_module(name: str) -> str | None:
    """The module a model name imports (``pkg.mod`` of ``pkg.mod:build``); None for built-ins."""
    if name in BUILTIN_MODELS:
        return None
    return name.partition(":")[0]


def plugin_allowed(name: str, allowed: Iterable[str]) -> bool:
    """Whether the model ``name`` may be built under the allow-list ``allowed``.

    Built-in models always may. A plugin ``pkg.mod:build`` may when the list holds
    ``pkg.mod:build`` itself, its module ``pkg.mod``, or a package above it (``pkg``).
    """
    module = plugin_module(name)
    if module is None:
        return True
    return any(entry in (name, module) or module.startswith(entry + ".") for entry in allowed)


def validate_plugin_entries(entries: Sequence[str], where: str) -> None:
    """Check an allow-list of plugins: each entry ``package.module`` or ``package.module:func``.

    Raises:
        ValueError: Naming ``where`` and the first malformed entry.
    """
    if isinstance(entries, str):
        raise ValueError(f"{where} must be a list of module names, got the string {entries!r}")
    for entry in entries:
        if not isinstance(entry, str) or not _PLUGIN_ENTRY.match(entry):
            raise ValueError(
                f"{where} entries must look like 'package.module' or 'package.module:build', "
                f"got {entry!r}"
            )


def _inside(path: str, directory: str) -> bool:
    try:
        return os.path.commonpath([path, directory]) == directory
    except ValueError:  # different drives
        return False


def _search_root(module: ModuleType | Any) -> str | None:
    """The sys.path folder a top-level module (or module spec) was found in, if it has one."""
    locations = getattr(module, "submodule_search_locations", None)
    if locations is None:
        locations = getattr(module, "__path__", None)
    origin = getattr(module, "origin", None) or getattr(module, "__file__", None)
    first = next(iter(locations), None) if locations is not None else None
    if first is not None:  # a package: its folder's parent
        return os.path.dirname(os.path.realpath(first))
    if origin and os.path.isabs(origin):
        return os.path.dirname(os.path.realpath(origin))
    return None  # built-in, frozen, or a namespace package without portions


@contextmanager
def _installed_only(untrusted: Sequence[str]) -> Iterator[None]:
    """Hide the working directory and ``untrusted`` folders from imports while the block runs.

    ``python -m`` puts the working directory on sys.path, so a ``.py`` next to a downloaded
    model would otherwise shadow (or be) the plugin a ``model.json`` names.
    """
    cwd = os.path.realpath(os.getcwd())
    bad = [os.path.realpath(d) for d in untrusted]

    def hidden(entry: str) -> bool:
        if entry in ("", "."):
            return True
        real = os.path.realpath(entry)
        return real == cwd or any(_inside(real, d) for d in bad)

    saved = list(sys.path)
    sys.path[:] = [p for p in saved if not hidden(p)]
    try:
        yield
    finally:
        sys.path[:] = saved


class _Guard:
    """Where a plugin's code may not come from: the working directory and untrusted folders."""

    def __init__(self, name: str, module_name: str, untrusted: Sequence[str]) -> None:
        self.name = name
        self.module_name = module_name
        self.top = module_name.split(".", 1)[0]
        self.cwd = os.path.realpath(os.getcwd())
        self.untrusted = [os.path.realpath(d) for d in untrusted]

    def _refuse(self, where: str) -> None:
        raise ValueError(
            f"model.name {self.name!r}: module {self.module_name} would be imported from "
            f"{where}, the working directory or the model's own folder; plugins load only "
            "from the installed environment (pip install the package)"
        )

    def root(self, root: str | None) -> None:
        """Refuse a top-level module found in the working directory or an untrusted folder."""
        if root is not None and (root == self.cwd or any(_inside(root, d) for d in self.untrusted)):
            self._refuse(root)

    def path(self, path: str | None) -> None:
        """Refuse a package folder or file of the plugin inside an untrusted folder, or inside
        ``<cwd>/<top>`` (a package ``__path__`` extended while the working dir was searched)."""
        if path is None or not os.path.isabs(path):
            return
        real = os.path.realpath(path)
        in_cwd_package = _inside(real, os.path.join(self.cwd, self.top))
        if in_cwd_package or any(_inside(real, d) for d in self.untrusted):
            self._refuse(real)


def _import_installed(name: str, module_name: str, untrusted: Sequence[str]) -> ModuleType:
    """Import ``module_name`` from the installed environment, never from CWD or ``untrusted``.

    The top-level package is located first without running it (``find_spec`` of a top-level
    name executes nothing) and refused if it lives in the working directory or an untrusted
    folder; then each level is imported only after its parent's search path was checked, with
    those folders hidden from sys.path throughout.
    """
    guard = _Guard(name, module_name, untrusted)
    parts = module_name.split(".")
    with _installed_only(untrusted):
        loaded = sys.modules.get(guard.top)
        if loaded is not None:
            guard.root(_search_root(loaded))
        else:
            found = importlib.util.find_spec(guard.top)
            if found is None:
                raise ImportError(f"No module named {guard.top!r} in the installed environment")
            guard.root(_search_root(found))
        module = importlib.import_module(guard.top)
        for i in range(1, len(parts)):
            for entry in getattr(module, "__path__", None) or []:
                guard.path(entry)
            module = importlib.import_module(".".join(parts[: i + 1]))
    guard.path(getattr(module, "__file__", None))
    return module


def _build_plugin(
    cfg: ModelConfig, spec: ModelSpec, untrusted_dirs: Sequence[str] | None
) -> nn.Module:
    """Import ``package.module:func`` from the environment and call ``func(cfg, spec)``."""
    module_name, _, attr = cfg.name.partition(":")
    try:
        if untrusted_dirs is None:
            module = importlib.import_module(module_name)
        else:
            module = _import_installed(cfg.name, module_name, untrusted_dirs)
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
    return _build_plugin(cfg, spec, untrusted_dirs)


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
