"""The local tune engine: a Katib-style search space run as an Optuna study over real trainings.

Katib's algorithms map onto Optuna samplers and its median stopping (or Hyperband) onto pruners
(:mod:`trainer.tune.samplers`). Each trial is a real training run of ``trainer.training.loop``,
driven by a :class:`TrialRunner`: a ``trainer.worker`` subprocess whose JSON ``eval`` lines are
reported to the trial as they appear (:class:`SubprocessTrialRunner`), or a call of
``trainer.training.loop.train`` in this process (:class:`InProcessTrialRunner`, for tests and
benchmarks).
A pruned trial is stopped the way a preempted one is (SIGTERM, or ``on_eval`` returning True).

Semantics follow Katib's experiment controller:

- a trial's objective value is the best value it reported (Katib's default metric strategy:
  ``min`` when minimising, ``max`` when maximising); intermediate values are reported at steps
  1, 2, 3, ... (the number of evaluations so far: epochs, with the trainer's per-epoch
  evaluation), which is what ``start_step`` and Hyperband's resource count;
- the search ends when ``maxTrialCount`` trials have finished (completed, pruned or failed,
  counting those of earlier attempts), when the objective reaches ``goal``, or when a grid is
  exhausted; it fails once its failed trials reach ``maxFailedTrialCount`` (Katib's rule).

The study lives in a journal file in the step's working area (``<work>/study.journal``;
mirrored to an object store when the work URI is remote), so a retried step resumes it: finished
trials are kept, and trials that a killed attempt left running are marked failed, not counted as
failures, and queued again with the same parameters (:mod:`trainer.tune.journal`). Optuna is
imported lazily: the trainer package imports without it.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.base import storage
from trainer.config import WorkerConfig
from trainer.tune import journal
from trainer.tune.journal import TrialRecord
from trainer.tune.runners import (
    InProcessTrialRunner,
    SubprocessTrialRunner,
    TrialFailed,
    TrialInterrupted,
    TrialOutcome,
    TrialRunner,
    is_number,
)
from trainer.tune.samplers import PRUNERS, SAMPLERS, make_pruner, make_sampler, suggest
from trainer.tune.space import SearchSpace, failure_budget_spent
from trainer.tune.values import grid_points

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

__all__ = [
    "PRUNERS",
    "SAMPLERS",
    "InProcessTrialRunner",
    "StudyResult",
    "SubprocessTrialRunner",
    "TooManyFailedTrials",
    "TrialFailed",
    "TrialInterrupted",
    "TrialOutcome",
    "TrialRecord",
    "TrialRunner",
    "make_pruner",
    "make_sampler",
    "run_study",
    "suggest",
]


class TooManyFailedTrials(RuntimeError):
    """The failed trials reached ``maxFailedTrialCount``: the search has failed."""


# --------------------------------------------------------------------------------------------
# The study
# --------------------------------------------------------------------------------------------


@dataclass
class StudyResult:
    """Where the search ended."""

    study_name: str
    objective_metric: str
    direction: str
    best_params: dict[str, Any]
    best_value: float | None
    best_trial: int | None
    trials: list[TrialRecord]
    importances: dict[str, float] | None
    stopped_reason: str

    def count(self, state: str) -> int:
        """Trials in ``state`` (interrupted ones excluded from ``FAIL``)."""
        return sum(1 for t in self.trials if t.state == state and not t.interrupted)


TrialConfigFn = Callable[[int, dict[str, Any], str], WorkerConfig]
"""(trial number, assignment, the trial's folder ``<work>/trials/<number>``) -> its worker
config."""


def _importances(study: optuna.Study) -> dict[str, float] | None:
    """fANOVA importances over completed trials, or None when there are too few to say."""
    import optuna
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(done) < 2:
        return None
    try:
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
        return {
            k: float(v)
            for k, v in optuna.importance.get_param_importances(study, evaluator=evaluator).items()
        }
    except (ValueError, RuntimeError) as e:  # e.g. every completed trial has the same params
        log.info("parameter importances not computed: %s", e)
        return None


class _Objective:
    """Runs one trial: draw, build the config, train with reports, return the best value."""

    def __init__(
        self,
        space: SearchSpace,
        trial_config: TrialConfigFn,
        runner: TrialRunner,
        nproc_per_node: int,
        study_name: str,
        work_uri: str,
    ) -> None:
        self.space, self.trial_config, self.runner = space, trial_config, runner
        self.work_uri = work_uri
        self.nproc_per_node, self.study_name = nproc_per_node, study_name
        self.metric = space.objective.objectiveMetricName
        self.maximize = space.objective.type == "maximize"

    def __call__(self, trial: optuna.trial.Trial) -> float:
        import optuna

        assignment = suggest(trial, self.space)
        trial.set_user_attr("assignment", assignment)
        reported: list[float] = []

        def on_eval(step: int, metrics: dict[str, float]) -> bool:
            value = metrics.get(self.metric)
            if value is None or not math.isfinite(value):
                return False
            reported.append(value)
            trial.report(value, len(reported))
            return trial.should_prune()

        trial_uri = storage.join(self.work_uri, "trials", str(trial.number))
        try:
            cfg = self.trial_config(trial.number, assignment, trial_uri)
            outcome = self.runner.run(
                cfg,
                name=f"{self.study_name}-trial-{trial.number}",
                work_uri=trial_uri,
                nproc_per_node=self.nproc_per_node,
                on_eval=on_eval,
            )
        except TrialInterrupted:
            trial.set_user_attr("interrupted", True)
            raise
        except (TrialFailed, ValueError, FileNotFoundError, TimeoutError, RuntimeError) as e:
            trial.set_user_attr("error", " ".join(str(e).split())[:2000])
            raise TrialFailed(str(e)) from e
        trial.set_user_attr("epochs", outcome.epochs)
        trial.set_user_attr("metrics", {k: v for k, v in outcome.metrics.items() if is_number(v)})
        if outcome.stopped:
            raise optuna.TrialPruned(f"pruned after {len(reported)} evaluations")
        if reported:
            return max(reported) if self.maximize else min(reported)
        final = outcome.metrics.get(self.metric)
        if final is None or not math.isfinite(final):
            msg = (
                f"objective metric {self.metric!r} was not reported; the trial reported "
                f"{sorted(outcome.metrics)} (is data.val_uri set?)"
            )
            trial.set_user_attr("error", msg)
            raise TrialFailed(msg)
        return float(final)


def _stop_reason(study: optuna.Study, space: SearchSpace) -> str | None:
    from optuna.trial import TrialState

    goal = space.objective.goal
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if goal is not None and done:
        best = study.best_value
        if (best >= goal) if space.objective.type == "maximize" else (best <= goal):
            return f"goal reached: {space.objective.objectiveMetricName}={best:.6g} (goal {goal})"
    return None


def _too_many_failed(failed: list[optuna.trial.FrozenTrial], limit: int) -> TooManyFailedTrials:
    last = failed[-1]
    why = last.user_attrs.get("error", "no message")
    return TooManyFailedTrials(
        f"{len(failed)} trials failed, reaching tune.maxFailedTrialCount={limit}; "
        f"last failure (trial {last.number}): {why}"
    )


def run_study(
    space: SearchSpace,
    trial_config: TrialConfigFn,
    *,
    runner: TrialRunner,
    work_uri: str,
    study_name: str,
    seed: int = 0,
    nproc_per_node: int = 1,
    timeout_s: float | None = None,
) -> StudyResult:
    """Run (or resume) the search described by ``space`` in ``work_uri``.

    Args:
        space: A validated search space.
        trial_config: Builds a trial's worker config from its number and assignment; a config
            it rejects (InputError) fails that trial.
        runner: Runs the trials.
        work_uri: The step's working area (stable across retries): holds the study journal.
        study_name: Deterministic name of the study; the same name resumes the same study.
        seed: Seed of the sampler (``random_state`` in the algorithm settings wins).
        nproc_per_node: Processes per trial.
        timeout_s: Start no new trial after this many seconds.

    Returns:
        The best parameters and every trial.

    Raises:
        TooManyFailedTrials: the failed trials reached ``maxFailedTrialCount``.
        TrialInterrupted: the step got SIGTERM; running trials were stopped (resumable).
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    metric = space.objective.objectiveMetricName
    with journal.study_file(work_uri) as (path, save):
        study = journal.open_study(path, study_name, space, seed)
        _log_resume(
            study, study_name, metric, requeued=journal.requeue_interrupted(study), path=path
        )
        _raise_if_too_many_failed(study, space)
        remaining = space.maxTrialCount - journal.finished(study) - len(journal.failed(study))
        reason = _stop_reason(study, space)
        jobs = _parallel_jobs(space, runner)
        progress = _Progress(space, save, reason or "maxTrialCount reached")
        objective = _Objective(space, trial_config, runner, nproc_per_node, study_name, work_uri)
        previous = _on_sigterm(runner)
        try:
            if remaining > 0 and reason is None:
                study.optimize(
                    objective,
                    n_trials=remaining,
                    n_jobs=jobs,
                    timeout=timeout_s,
                    catch=(TrialFailed,),
                    callbacks=[progress],
                )
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            save()
        _raise_if_too_many_failed(study, space)
        return _result(study, space, study_name, progress.reason, timeout_s)


def _log_resume(
    study: optuna.Study, study_name: str, metric: str, *, requeued: list[int], path: str
) -> None:
    records = journal.records(study, metric)
    if records:
        log.info(
            "resuming study %s: %d trials finished before, %d re-queued (%s)",
            study_name,
            sum(r.state in ("COMPLETE", "PRUNED", "FAIL") and not r.interrupted for r in records),
            len(requeued),
            path,
        )


def _raise_if_too_many_failed(study: optuna.Study, space: SearchSpace) -> None:
    failed = journal.failed(study)
    if failure_budget_spent(len(failed), space.maxFailedTrialCount):
        raise _too_many_failed(failed, space.maxFailedTrialCount)


def _parallel_jobs(space: SearchSpace, runner: TrialRunner) -> int:
    jobs = max(1, min(space.parallelTrialCount, runner.capacity))
    if jobs < space.parallelTrialCount:
        log.info(
            "running %d trials at a time (parallelTrialCount %d; this machine fits %d)",
            jobs,
            space.parallelTrialCount,
            runner.capacity,
        )
    return jobs


class _Progress:
    """Study callback after each trial: save the journal, log progress, stop when done.

    ``reason`` says why the search ended (``failed``, a goal or grid stop, or the default).
    """

    def __init__(self, space: SearchSpace, save: Callable[[], None], reason: str) -> None:
        self.space = space
        self.save = save
        self.reason = reason
        self._lock = threading.Lock()

    def __call__(self, st: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        space = self.space
        with self._lock:
            self.save()
            fails = journal.failed(st)
            best = journal.best(st)
            log.info(
                "trial %d %s%s; %d/%d finished, %d failed, best %s",
                trial.number,
                trial.state.name.lower(),
                f" {space.objective.objectiveMetricName}={trial.value:.6g}"
                if trial.value is not None
                else "",
                journal.finished(st) + len(fails),
                space.maxTrialCount,
                len(fails),
                f"{best[1]:.6g} (trial {best[0]})" if best else "none yet",
            )
            if failure_budget_spent(len(fails), space.maxFailedTrialCount):
                self.reason = "failed"
                st.stop()
            elif (why := _stop_reason(st, space)) is not None:
                self.reason = why
                st.stop()


def _result(
    study: optuna.Study,
    space: SearchSpace,
    study_name: str,
    reason: str,
    timeout_s: float | None,
) -> StudyResult:
    if reason == "maxTrialCount reached" and (
        journal.finished(study) + len(journal.failed(study)) < space.maxTrialCount
    ):
        reason = f"timeout: no new trials after {timeout_s} s"
    if _grid_exhausted(study, space):
        reason = "grid exhausted"
    best = journal.best(study)
    best_params: dict[str, Any] = {}
    if best is not None:
        best_params = dict(study.trials[best[0]].user_attrs.get("assignment", {}))
    return StudyResult(
        study_name=study_name,
        objective_metric=space.objective.objectiveMetricName,
        direction=space.objective.type,
        best_params=best_params,
        best_value=best[1] if best else None,
        best_trial=best[0] if best else None,
        trials=journal.records(study, space.objective.objectiveMetricName),
        importances=_importances(study),
        stopped_reason=reason,
    )


def _grid_exhausted(study: optuna.Study, space: SearchSpace) -> bool:
    if space.algorithm.algorithmName != "grid":
        return False
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))) >= len(
        grid_points(space)
    )


def _on_sigterm(runner: TrialRunner) -> Any:
    """A cancelled step (SIGTERM) stops its running trials; they are re-run on resume."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        log.warning("SIGTERM: stopping the running trials (a retried step resumes the study)")
        runner.interrupt()

    return signal.signal(signal.SIGTERM, handler)
