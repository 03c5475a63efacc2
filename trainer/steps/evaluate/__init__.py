"""The evaluate step: score a model on the test split, report it and decide the promotion gate.

What other code may use is exported here; the rest is this step's own:

- :mod:`~trainer.steps.evaluate.step`: :func:`evaluate` itself (loading the models and the
  split, comparing with the champion, writing the outputs) and :class:`EvaluateConfig`;
- :mod:`~trainer.steps.evaluate.metrics`: which metrics each task reports, their direction
  (:data:`HIGHER_IS_BETTER`, which register checks its gate metric against) and the scoring;
- :mod:`~trainer.steps.evaluate.gate`: the promotion gate, and :data:`MIN_GATE_ROWS`, the rows a
  score needs (preprocess checks the test split against it);
- :mod:`~trainer.steps.evaluate.baselines`: the reference models a model must beat;
- :mod:`~trainer.steps.evaluate.report`: the HTML page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.base.lazy import lazy_exports

if TYPE_CHECKING:
    from trainer.steps.evaluate.gate import MIN_GATE_ROWS, GateConfig, decide_gate
    from trainer.steps.evaluate.metrics import (
        AUTO_METRIC,
        HIGHER_IS_BETTER,
        TASK_METRICS,
        EvaluateResult,
    )
    from trainer.steps.evaluate.step import (
        EvaluateConfig,
        evaluate,
        evaluate_config,
        read_history,
    )

__all__ = [
    "AUTO_METRIC",
    "HIGHER_IS_BETTER",
    "MIN_GATE_ROWS",
    "TASK_METRICS",
    "EvaluateConfig",
    "EvaluateResult",
    "GateConfig",
    "decide_gate",
    "evaluate",
    "evaluate_config",
    "read_history",
]

# Loaded on first use: the step (models, torch) only where it runs; the metrics' directions and
# the gate's rows without torch (register, preprocess).
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AUTO_METRIC": "metrics",
        "HIGHER_IS_BETTER": "metrics",
        "MIN_GATE_ROWS": "gate",
        "TASK_METRICS": "metrics",
        "EvaluateConfig": "step",
        "EvaluateResult": "metrics",
        "GateConfig": "gate",
        "decide_gate": "gate",
        "evaluate": "step",
        "evaluate_config": "step",
        "read_history": "step",
    },
)
