"""The tune step: search hyperparameters (an Optuna study here, or a Katib Experiment), report.

What other code may use is exported here; the rest is this step's own:

- :mod:`~trainer.steps.tune.step`: :func:`tune` itself, :class:`TuneConfig`, and each trial's
  worker config (the train step's, with the trial's values);
- :mod:`~trainer.steps.tune.report`: what the search found (:class:`TuneStepResult`) and its
  HTML page.

The search itself (the space, the study, the Katib Experiment) is :mod:`trainer.tune`.
"""

from __future__ import annotations

from trainer.steps.tune.report import TuneStepResult, render_tune_report
from trainer.steps.tune.step import (
    TUNABLE_SECTIONS,
    TuneConfig,
    trial_worker_config,
    tunable_fields,
    tune,
    tune_disabled,
)

__all__ = [
    "TUNABLE_SECTIONS",
    "TuneConfig",
    "TuneStepResult",
    "render_tune_report",
    "trial_worker_config",
    "tunable_fields",
    "tune",
    "tune_disabled",
]
