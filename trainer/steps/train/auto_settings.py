"""Training settings from the data: a batch, a length, a warmup and early stopping that fit.

A default of 256 rows a batch for 10 epochs suits a few thousand rows and nothing else: a
178-row table has no full batch, a 569-row table gets 10 optimizer steps, and a 10-million-row
table runs 400,000. :func:`choose_settings` picks, for every setting the user left alone:

- ``train.global_batch_size``: about :data:`BATCHES_PER_EPOCH` batches an epoch, a power of two
  in [:data:`MIN_BATCH`, :data:`MAX_BATCH`] (never more than the training rows), a multiple of
  the number of processes;
- ``train.epochs``: enough epochs for :data:`MIN_STEPS` optimizer steps (at least
  :data:`MIN_EPOCHS`, at most :data:`MAX_EPOCHS`), fewer where the model is so large that the
  run would exceed :data:`SAMPLE_PARAM_BUDGET` (rows seen x parameters);
- ``optim.warmup_steps``: :data:`WARMUP_FRACTION` of the steps;
- ``train.early_stopping``: on ``val_loss`` (the best weights are exported), with a patience of
  about a fifth of the evaluations; and ``train.eval_every_steps``: about
  :data:`EVALS_PER_RUN` evaluations where epochs are long.

A field counts as set by the user when it is listed in :attr:`AutoSettingsConfig.fixed` (what
:func:`trainer.steps.train.step_settings` records from the pipeline parameters and JSON
overrides) or when its value differs from the config's default: what the user sets always wins.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from trainer.base.typedconfig import require
from trainer.config import EarlyStoppingConfig, OptimConfig, TrainConfig

__all__ = [
    "AUTO_FIELDS",
    "AUTO_SETTINGS_FILE",
    "AutoSettings",
    "AutoSettingsConfig",
    "choose_settings",
    "user_set_fields",
]

AUTO_FIELDS = (
    "train.global_batch_size",
    "train.epochs",
    "optim.warmup_steps",
    "train.early_stopping",
    "train.eval_every_steps",
)
"""The settings chosen from the data when the user sets none."""

AUTO_SETTINGS_FILE = "auto_settings.json"
"""What the train step chose, placed in the model directory for evaluate's report."""
BATCHES_PER_EPOCH = 16
"""Aim for about this many optimizer steps per pass over the training rows."""
MIN_BATCH = 16
"""Smallest chosen batch (smaller tables get their row count, rounded down to a power of two)."""
MAX_BATCH = 1024
"""Largest chosen batch: beyond it a tabular MLP gains little per step."""
MIN_STEPS = 6000
"""Optimizer steps a run aims for (early stopping usually ends small tables sooner). 1000 before
issue 28: the ensemble of MLPs with periodic embeddings needs about 6000 to follow an
hour-of-day cycle (``benchmarks/default_models.py``, sf_temps: 0.81 of HGB at 4000, 1.17 at
6000); RealMLP trains 256 epochs."""
MIN_EPOCHS = 3
"""Fewest chosen epochs: a large table still gets a few passes, with early stopping."""
MAX_EPOCHS = 500
"""Most chosen epochs."""
SAMPLE_PARAM_BUDGET = 2e12
"""Rows seen x model parameters that a chosen run stays under (a big model gets fewer epochs)."""
WARMUP_FRACTION = 0.05
"""Share of the steps spent warming the learning rate up."""
MAX_WARMUP = 1000
"""Most chosen warmup steps."""
EVALS_PER_RUN = 20
"""Where an epoch is longer than this share of the run, evaluate every ``steps / 20`` steps."""
MIN_PATIENCE = 5
"""Fewest evaluations without improvement before early stopping."""
MAX_PATIENCE = 20
"""Most evaluations without improvement before early stopping."""


@dataclass(kw_only=True, slots=True)
class AutoSettingsConfig:
    """Settings from the data for the train step (see :mod:`trainer.steps.train.auto_settings`)."""

    enabled: bool = True
    """Choose the batch, epochs, warmup, early stopping and evaluation period from the table
    size and the model size, for each one not set; ``false`` keeps the config's defaults."""
    fixed: list[str] = field(default_factory=list)
    """Dotted fields that the user set (``train.epochs`` ...), which are never changed; the
    pipeline fills it from the parameters given. A field whose value differs from its default
    counts as set too."""
    min_steps: int = MIN_STEPS
    """Optimizer steps a chosen run aims for (more epochs for a small table, within
    :data:`MAX_EPOCHS` and the parameter budget)."""
    target_scaling: bool = True
    """Regression: train on the target standardised with the training split's mean and standard
    deviation (recorded in the model; predictions and metrics are in the target's units)."""

    def __post_init__(self) -> None:
        require(self.min_steps > 0, "auto.min_steps", "must be > 0", self.min_steps)
        unknown = sorted(set(self.fixed) - set(AUTO_FIELDS))
        require(
            not unknown,
            "auto.fixed",
            f"may only list {', '.join(AUTO_FIELDS)}",
            unknown[0] if unknown else None,
        )


@dataclass(frozen=True, slots=True)
class AutoSettings:
    """What :func:`choose_settings` decided, and from what."""

    train: TrainConfig
    """The train section with the chosen values in place."""
    optim: OptimConfig
    """The optimizer section with the chosen warmup in place."""
    chosen: dict[str, Any]
    """The values chosen from the data, by dotted field."""
    user_set: dict[str, Any]
    """The values the user set, by dotted field (kept as they were)."""
    inputs: dict[str, int | None]
    """What the choice was based on: training and validation rows, parameters, processes."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON for the model directory and the report."""
        return {"chosen": self.chosen, "user_set": self.user_set, "inputs": self.inputs}

    def summary(self) -> str:
        """One line for the log: ``batch 16, epochs 167, ... (chosen from 124 rows, ...)``."""
        shown = ", ".join(f"{k}={_show(v)}" for k, v in self.chosen.items()) or "nothing"
        kept = ", ".join(f"{k}={_show(v)}" for k, v in self.user_set.items()) or "none"
        rows = self.inputs.get("train_rows")
        return f"settings from the data ({rows} training rows): {shown}; set by the user: {kept}"


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return str(value)


def _value(train: TrainConfig, optim: OptimConfig, dotted: str) -> Any:
    section, name = dotted.split(".", 1)
    value = getattr(train if section == "train" else optim, name)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def user_set_fields(train: TrainConfig, optim: OptimConfig, fixed: list[str]) -> set[str]:
    """The auto-chosen fields the user set: listed in ``fixed`` or different from the default."""
    defaults_train, defaults_optim = TrainConfig(), OptimConfig()
    return {
        f
        for f in AUTO_FIELDS
        if f in fixed or _value(train, optim, f) != _value(defaults_train, defaults_optim, f)
    }


def _pow2_floor(n: float) -> int:
    return 1 << max(math.floor(math.log2(n)), 0) if n >= 1 else 1


def auto_batch(n_train: int, world_size: int) -> int:
    """About :data:`BATCHES_PER_EPOCH` batches an epoch, a power of two within the bounds."""
    batch = min(max(_pow2_floor(n_train / BATCHES_PER_EPOCH), MIN_BATCH), MAX_BATCH)
    batch = min(batch, _pow2_floor(max(n_train, 1)))
    if batch % world_size:  # every process takes the same share
        batch = max(world_size, batch - batch % world_size)
    return batch


def auto_epochs(
    steps_per_epoch: int, n_train: int, n_params: int | None, min_steps: int = MIN_STEPS
) -> int:
    """Enough epochs for ``min_steps`` steps, capped by the sample x parameter budget."""
    epochs = min(max(math.ceil(min_steps / max(steps_per_epoch, 1)), MIN_EPOCHS), MAX_EPOCHS)
    if n_params:
        affordable = int(SAMPLE_PARAM_BUDGET / (n_params * max(n_train, 1)))
        epochs = min(epochs, max(affordable, 1))
    return epochs


def choose_settings(
    train: TrainConfig,
    optim: OptimConfig,
    *,
    n_train: int,
    n_val: int,
    n_params: int | None,
    world_size: int,
    fixed: list[str] | None = None,
    min_steps: int = MIN_STEPS,
) -> AutoSettings:
    """Fill the settings the user left alone with values that fit the data.

    Args:
        train: The train section as configured.
        optim: The optimizer section as configured.
        n_train: Rows of the training split.
        n_val: Rows of the validation split (0: no early stopping).
        n_params: Parameters of the model, if known (caps the epochs of a big model).
        world_size: Training processes (the batch must divide by it).
        fixed: Dotted fields the user set, besides those that differ from their defaults.
        min_steps: Optimizer steps to aim for (see :attr:`AutoSettingsConfig.min_steps`).

    Returns:
        The sections with the chosen values, and a record of what was chosen and kept.
    """
    user = user_set_fields(train, optim, list(fixed or []))
    chosen: dict[str, Any] = {}
    batch = train.global_batch_size
    if "train.global_batch_size" not in user:
        batch = chosen["train.global_batch_size"] = auto_batch(n_train, world_size)
    steps_per_epoch = max(n_train // max(batch, 1), 1)
    epochs = train.epochs
    if "train.epochs" not in user:
        epochs = chosen["train.epochs"] = auto_epochs(steps_per_epoch, n_train, n_params, min_steps)
    total = epochs * steps_per_epoch
    if train.max_steps:
        total = min(total, train.max_steps)
    if "optim.warmup_steps" not in user:
        chosen["optim.warmup_steps"] = min(round(WARMUP_FRACTION * total), MAX_WARMUP)
    eval_every = train.eval_every_steps
    if "train.eval_every_steps" not in user and steps_per_epoch * EVALS_PER_RUN > total:
        eval_every = chosen["train.eval_every_steps"] = max(total // EVALS_PER_RUN, 1)
    if "train.early_stopping" not in user and n_val > 0:
        evals = total // eval_every if eval_every else max(total // steps_per_epoch, 1)
        patience = min(max(evals // 5, MIN_PATIENCE), MAX_PATIENCE)
        chosen["train.early_stopping"] = {"metric": "val_loss", "mode": "min", "patience": patience}
    new_train = dataclasses.replace(
        train,
        global_batch_size=batch,
        epochs=epochs,
        eval_every_steps=eval_every,
        early_stopping=(
            EarlyStoppingConfig(**chosen["train.early_stopping"])
            if "train.early_stopping" in chosen
            else train.early_stopping
        ),
    )
    new_optim = dataclasses.replace(
        optim, warmup_steps=chosen.get("optim.warmup_steps", optim.warmup_steps)
    )
    return AutoSettings(
        train=new_train,
        optim=new_optim,
        chosen=chosen,
        user_set={f: _value(train, optim, f) for f in AUTO_FIELDS if f in user},
        inputs={
            "train_rows": n_train,
            "val_rows": n_val,
            "parameters": n_params,
            "processes": world_size,
        },
    )
