"""The train step: a preprocessed dataset to a worker config, and the training job launched.

What other code may use is exported here; the rest is this step's own:

- :mod:`~trainer.steps.train.step`: :func:`train_step` itself, :class:`TrainStepConfig` and
  :func:`step_settings` (the train and tune steps' one mapping from the pipeline's parameters);
- :mod:`~trainer.steps.train.auto_settings`: the batch, length, warmup and early stopping
  chosen from the data, recorded in the model as :data:`AUTO_SETTINGS_FILE`;
- :mod:`~trainer.steps.train.cost`: the job's metrics endpoint and its cost (an estimate before,
  the actual after), recorded in the model as :data:`COST_FILE`.

The pod settings the pipeline gives the train task are the launcher's own
(:mod:`trainer.launch.jobspec`), so a pod that trains looks the same in both places.
"""

from __future__ import annotations

from trainer.launch.jobspec import GPU_TOLERATION, OBJECT_STORE_ENV, SHM_SIZE, TRAIN_POD_RESOURCES
from trainer.steps.train.auto_settings import AUTO_SETTINGS_FILE
from trainer.steps.train.cost import COST_FILE, cost_metrics
from trainer.steps.train.step import (
    TrainStepConfig,
    build_worker_config,
    plan_worker_config,
    read_schema,
    record_fixed,
    step_settings,
    train_step,
)

__all__ = [
    "AUTO_SETTINGS_FILE",
    "COST_FILE",
    "GPU_TOLERATION",
    "OBJECT_STORE_ENV",
    "SHM_SIZE",
    "TRAIN_POD_RESOURCES",
    "TrainStepConfig",
    "build_worker_config",
    "cost_metrics",
    "plan_worker_config",
    "read_schema",
    "record_fixed",
    "step_settings",
    "train_step",
]
