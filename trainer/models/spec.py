"""What the data tells a model about its shapes (``ModelSpec``); no torch, so that steps which
only read a model's ``model.json`` start without it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, get_args

ModelTask = Literal["classification", "regression", "lm"]
TASKS: tuple[str, ...] = get_args(ModelTask)

__all__ = ["TASKS", "ModelSpec", "ModelTask"]


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
        if self.task not in TASKS:
            raise ValueError(f"spec.task must be one of {list(TASKS)}, got {self.task!r}")
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
