"""User-model plugins that misbehave on purpose, for the failure-behaviour integration tests.

They wrap the built-in MLP and are selected as ``model.name = "tests.plugins.faults:<name>"``,
i.e. through the same plugin path a user model takes. Options (``model.options``):
``at`` (forward call, 1-based), ``rank`` (only this rank misbehaves; env RANK, tests may read
it), ``marker`` (a file: misbehave only while it is absent, then create it) and ``max_rows``.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

import torch

from trainer.models import build_model


class _Faulty(torch.nn.Module):
    def __init__(self, cfg, spec, mode: str) -> None:
        super().__init__()
        self.inner = build_model(dataclasses.replace(cfg, name="mlp", options={}), spec)
        self.opts = dict(cfg.options)
        self.mode = mode
        self.calls = 0
        # An inner model that computes its own loss (the MLP ensemble) is trained the same way
        # through the wrapper: the OOM tests compare against a plain ``mlp`` run.
        self.computes_loss = getattr(self.inner, "computes_loss", False)

    def _armed(self) -> bool:
        rank = self.opts.get("rank")
        if rank is not None and int(os.environ.get("RANK", "0")) != int(rank):
            return False
        marker = self.opts.get("marker")
        return not (marker and Path(marker).exists())

    def _disarm(self) -> None:
        marker = self.opts.get("marker")
        if marker:
            Path(marker).write_text("fired\n")

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.training:
            self.calls += 1
        if (
            self.mode == "oom"
            and self.training
            and x.shape[0] > int(self.opts["max_rows"])
            and self._armed()
        ):
            raise torch.OutOfMemoryError(f"simulated: {x.shape[0]} rows do not fit")
        out = self.inner(x) if targets is None else self.inner(x, targets=targets)
        if self.training and self.calls == int(self.opts.get("at", -1)) and self._armed():
            if self.mode == "nan":
                self._disarm()
                return out * float("nan")
            if self.mode == "kill":
                self._disarm()
                os.kill(os.getpid(), signal.SIGKILL)
        if self.mode == "nan_always" and self.training and self.calls >= int(self.opts["at"]):
            return out * float("nan")
        return out


def oom(cfg, spec):
    """Raises torch's OOM error for any training batch larger than ``max_rows``."""
    return _Faulty(cfg, spec, "oom")


def nan(cfg, spec):
    """Returns NaN outputs once, at forward call ``at``."""
    return _Faulty(cfg, spec, "nan")


def nan_always(cfg, spec):
    """Returns NaN outputs from forward call ``at`` on, every time (rollbacks cannot help)."""
    return _Faulty(cfg, spec, "nan_always")


def kill(cfg, spec):
    """SIGKILLs its own process at forward call ``at`` (once, guarded by ``marker``)."""
    return _Faulty(cfg, spec, "kill")
