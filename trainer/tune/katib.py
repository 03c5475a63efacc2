"""The Katib engine: a search space -> a Katib Experiment, launched and watched.

The Experiment itself is built in :mod:`trainer.tune.experiment`. The launcher is the train
launcher's own loop (:mod:`trainer.launch.watch`): a deterministic name
(:func:`experiment_name`), re-attach on retry (also after a 409), an owner reference to the
launcher's pod, a deadline and SIGTERM that delete the Experiment, and a failure when the
Experiment fails or its failed trials reach ``maxFailedTrialCount`` (Katib's own rule,
failed >= max, counting trials whose metrics were unavailable: see
:func:`trainer.tune.space.failure_budget_spent`). A succeeded Experiment is kept for Katib's UI.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from trainer.launch.kube import EXPERIMENTS, KATIB_API_CALLS, KATIB_VERSION, KubeApi, KubeApiError
from trainer.launch.owners import PodRef
from trainer.launch.resourcelauncher import ResourceLauncher
from trainer.launch.watch import TERMINAL, Resource, Watch
from trainer.tune.experiment import (
    build_experiment,
    experiment_name,
    katib_name,
    trial_template_errors,
)
from trainer.tune.space import SearchSpace, failure_budget_spent
from trainer.tune.values import sample_value

__all__ = [
    "KATIB_API_CALLS",
    "KatibLauncher",
    "TuneResult",
    "build_experiment",
    "experiment_name",
    "katib_name",
    "trial_template_errors",
]

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# The launcher
# --------------------------------------------------------------------------------------------


@dataclass
class TuneResult:
    """What a finished search found."""

    experiment: str
    """``namespace/name`` of the Experiment."""
    best_parameters: dict[str, int | float | str]
    """The best trial's values by dotted config field, typed like the fields."""
    best_value: float
    """The best trial's objective value."""
    best_trial: str
    trials: dict[str, int] = field(default_factory=dict)
    """Trial counts: ``total``, ``succeeded``, ``failed``, ``running``, ``pending``, ``killed``,
    ``early_stopped``."""
    reason: str = ""
    """Why Katib ended the search (``ExperimentMaxTrialsReached``, ``ExperimentGoalReached``)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "best_parameters": dict(self.best_parameters),
            "best_value": self.best_value,
            "best_trial": self.best_trial,
            "trials": dict(self.trials),
            "reason": self.reason,
        }


def trial_counts(experiment: Mapping[str, Any]) -> dict[str, int]:
    """The Experiment's trial counts from its status."""
    st = experiment.get("status") or {}
    keys = {
        "total": "trials",
        "succeeded": "trialsSucceeded",
        "failed": "trialsFailed",
        "running": "trialsRunning",
        "pending": "trialsPending",
        "killed": "trialsKilled",
        "early_stopped": "trialsEarlyStopped",
        "metrics_unavailable": "trialMetricsUnavailable",
    }
    return {k: int(st.get(v) or 0) for k, v in keys.items()}


def best_trial(
    experiment: Mapping[str, Any], space: SearchSpace
) -> tuple[str, dict[str, int | float | str], float] | None:
    """(trial name, dotted parameters, objective value) of ``status.currentOptimalTrial``, or
    ``None`` while no trial has reported the objective metric."""
    opt = (experiment.get("status") or {}).get("currentOptimalTrial") or {}
    trial = opt.get("bestTrialName")
    metric = space.objective.objectiveMetricName
    found = [
        m for m in (opt.get("observation") or {}).get("metrics") or [] if m.get("name") == metric
    ]
    if not trial or not found:
        return None
    key = "min" if space.objective.type == "minimize" else "max"
    value = None
    for k in (key, "latest"):
        try:
            value = float(found[0].get(k))
        except (TypeError, ValueError):
            continue  # Katib writes "unavailable"
        if math.isfinite(value):
            break
        value = None
    if value is None:
        return None
    by_name = {katib_name(p.name): p for p in space.parameters}
    params: dict[str, int | float | str] = {}
    for a in opt.get("parameterAssignments") or []:
        p = by_name.get(str(a.get("name")))
        if p is not None:
            params[p.name] = sample_value(p, a.get("value"))
    return str(trial), params, value


class _Experiment(Resource):
    """A Katib Experiment on the watch loop: progress reported as it changes; done when Katib
    ends it or its failed trials reach ``maxFailedTrialCount``."""

    kind = "Katib Experiment"
    kubectl = "experiment"
    version = KATIB_VERSION
    plural = EXPERIMENTS
    noun = "Experiment"
    deleted = "it was deleted, with its trials and their jobs"

    def __init__(self, space: SearchSpace, ref: str, report: Callable[[str], None]) -> None:
        self.space = space
        self.ref = ref
        self.report = report
        self.counts: dict[str, int] = {}
        self.reported: tuple[Any, ...] | None = None

    def observe(self, obj: dict[str, Any], state: str) -> bool:
        self.counts = trial_counts(obj)
        best = best_trial(obj, self.space)
        now = (state, tuple(self.counts.values()), best and best[0])
        if now != self.reported:
            self.reported = now
            self.report(self.progress(state, best))
        # Katib fails it too at that count; do not wait for that.
        return state in TERMINAL or self.budget_spent()

    def budget_spent(self) -> bool:
        """Katib's failure count (failed, and trials without metrics) reached the budget."""
        failed = self.counts.get("failed", 0) + self.counts.get("metrics_unavailable", 0)
        return failure_budget_spent(failed, self.space.maxFailedTrialCount)

    def describe(self, state: str) -> str:
        return f"it was {state}, {_counts_text(self.counts)}"

    def progress(self, state: str, best: tuple[str, dict[str, Any], float] | None) -> str:
        text = f"Katib Experiment {self.ref}: {state}; {_counts_text(self.counts)}"
        if best is not None:
            values = ", ".join(f"{k}={v}" for k, v in best[1].items())
            text += (
                f"; best so far {self.space.objective.objectiveMetricName}={best[2]:.6g} "
                f"({best[0]}: {values})"
            )
        return text


class KatibLauncher(ResourceLauncher):
    """Creates (or re-attaches to) an Experiment, reports progress, returns the best trial.

    Args:
        namespace: namespace of the Experiment.
        api: the Kubernetes API (default: in-cluster or kubeconfig, on first use).
        own_pod: the launcher's pod; the Experiment gets an owner reference to it when it is in
            the same namespace, so deleting the run's pods deletes the search.
        poll_s: seconds between status reads.
        on_exit: what happens to the Experiment on failure, deadline or cancellation.
        report: where progress lines go (default: this module's logger).
    """

    on_exit_choices = ("delete", "keep")

    def __init__(
        self,
        *,
        namespace: str,
        api: KubeApi | None = None,
        own_pod: PodRef | None = None,
        poll_s: float = 10.0,
        on_exit: Literal["delete", "keep"] = "delete",
        report: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(
            namespace=namespace, api=api, own_pod=own_pod, poll_s=poll_s, on_exit=on_exit
        )
        self.report = report or log.info

    def run(
        self, experiment: dict[str, Any], space: SearchSpace, *, timeout_s: float | None
    ) -> TuneResult:
        """Create or re-attach to ``experiment`` and wait until it ends.

        Raises:
            RuntimeError: the Experiment failed, too many trials failed, no trial reported the
                objective, it vanished, or the API refused a call; :class:`LaunchCancelled` on
                SIGTERM.
            TimeoutError: ``timeout_s`` passed first.
        """
        name = str((experiment.get("metadata") or {}).get("name"))
        resource = _Experiment(space, f"{self.namespace}/{name}", self.report)
        watch = self.watch(resource, name, timeout_s, self.report)
        exp = watch.run(experiment)
        return _Outcome(self.api, watch, resource, space).finish(exp)


class _Outcome:
    """What a finished Experiment means for the step: the best trial, or a failure."""

    def __init__(
        self, api: KubeApi, watch: Watch, resource: _Experiment, space: SearchSpace
    ) -> None:
        self.api = api
        self.watch = watch
        self.ns = watch.ns
        self.name = watch.name
        self.ref = watch.ref
        self.counts = resource.counts
        self.space = space
        self.resource = resource

    def finish(self, exp: dict[str, Any]) -> TuneResult:
        conds = (exp.get("status") or {}).get("conditions") or []
        last: Mapping[str, Any] = next(
            (c for c in reversed(conds) if c.get("status") == "True"), {}
        )
        budget = self.space.maxFailedTrialCount
        spent = self.resource.budget_spent()
        if self.watch.state != "Succeeded" or spent:
            failed = self.counts["failed"] + self.counts.get("metrics_unavailable", 0)
            why = (
                f"{failed} trials failed, reaching maxFailedTrialCount={budget}"
                if spent
                else f"{last.get('reason', 'Failed')}: {last.get('message', '(no message)')}"
            )
            detail = self.failed_trials()
            done = self.watch.apply_on_exit()
            # One line (the step's error line): Katib's reason, the failed trials' own
            # messages, what happened to the Experiment.
            raise RuntimeError(
                f"Katib Experiment {self.ref} failed: {why} ({_counts_text(self.counts)})"
                + (f"; {detail}" if detail else "")
                + f"; {done}"
            )
        best = best_trial(exp, self.space)
        if best is not None and not best[1]:
            best = self.best_from_trial(best)
        if best is None:
            raise RuntimeError(
                f"Katib Experiment {self.ref} succeeded but no trial reported "
                f"{self.space.objective.objectiveMetricName!r} (the worker prints name=value "
                "lines only with train.metrics_stdout=true, after each evaluation)"
            )
        trial, params, value = best
        self.watch.report(
            f"Katib Experiment {self.ref} succeeded ({last.get('reason', '')}): best "
            f"{self.space.objective.objectiveMetricName}={value:.6g} from {trial}"
        )
        return TuneResult(
            experiment=self.ref,
            best_parameters=params,
            best_value=value,
            best_trial=trial,
            trials=dict(self.counts),
            reason=str(last.get("reason", "")),
        )

    def best_from_trial(
        self, best: tuple[str, dict[str, Any], float]
    ) -> tuple[str, dict[str, Any], float]:
        """The best trial's parameters from the Trial itself (when the status lacks them)."""
        trial = self.api.get_trial(self.ns, best[0]) or {}
        by_name = {katib_name(p.name): p for p in self.space.parameters}
        params = {
            by_name[a["name"]].name: sample_value(by_name[a["name"]], a.get("value"))
            for a in (trial.get("spec") or {}).get("parameterAssignments") or []
            if a.get("name") in by_name
        }
        return best[0], params, best[2]

    def failed_trials(self) -> str:
        """The failed trials' names and Katib's messages (the first three), on one line."""
        try:
            trials = self.api.list_trials(self.ns, self.name)
        except KubeApiError as e:
            return f"failed trials: unavailable ({e})"
        lines = []
        for t in trials:
            conds = (t.get("status") or {}).get("conditions") or []
            failed = next(
                (c for c in conds if c.get("type") == "Failed" and c.get("status") == "True"), None
            )
            if failed is not None:
                message = " ".join(str(failed.get("message", "")).split())
                reason = failed.get("reason", "")
                lines.append(f"trial {t['metadata']['name']}: {reason}: {message}")
        if not lines:
            return ""
        more = f" (and {len(lines) - 3} more)" if len(lines) > 3 else ""
        return "failed trials: " + "; ".join(lines[:3]) + more


def _counts_text(c: Mapping[str, int]) -> str:
    if not c:
        return "no trials yet"
    done = c["succeeded"] + c["failed"] + c["killed"] + c["early_stopped"]
    return (
        f"{done}/{c['total']} trials done ({c['succeeded']} succeeded, {c['failed']} failed, "
        f"{c['early_stopped']} early-stopped), {c['running']} running, {c['pending']} pending"
    )
