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
  exhausted; it fails once *more than* ``maxFailedTrialCount`` trials have failed.

The study lives in a journal file in the step's working area (``<work>/study.journal``;
mirrored to an object store when the work URI is remote), so a retried step resumes it: finished
trials are kept, and trials that a killed attempt left running are marked failed, not counted as
failures, and queued again with the same parameters. Optuna is imported lazily: the trainer
package imports without it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from trainer.base import storage
from trainer.base.errors import InputError
from trainer.config import WorkerConfig
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
from trainer.tune.space import SearchSpace
from trainer.tune.values import grid_points

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

JOURNAL_NAME = "study.journal"
"""File of the study inside the work URI."""

_INTERRUPTED_ATTR = "interrupted_trials"
"""Study user attribute: numbers of trials a killed attempt left unfinished (re-queued)."""

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
    """More trials failed than ``maxFailedTrialCount`` allows: the search has failed."""


# --------------------------------------------------------------------------------------------
# The study
# --------------------------------------------------------------------------------------------


@dataclass
class TrialRecord:
    """One trial as the report and the step's outputs show it."""

    number: int
    state: str
    """``COMPLETE``, ``PRUNED``, ``FAIL`` (``interrupted`` tells a re-queued one), ``RUNNING``."""
    value: float | None
    params: dict[str, Any]
    epochs: float | None
    intermediate: list[tuple[int, float]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    interrupted: bool = False


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


@contextlib.contextmanager
def _study_file(work_uri: str) -> Iterator[tuple[str, Callable[[], None]]]:
    """A local journal path for the study, plus a function that saves it to ``work_uri``.

    A local work URI holds the journal itself; an object-store one gets a copy after each trial
    (the complete lines only), and the copy is read back when a retried step starts.
    """
    local = storage.local_path(work_uri)
    if local is not None:
        os.makedirs(local, exist_ok=True)
        yield os.path.join(local, JOURNAL_NAME), lambda: None
        return
    remote = storage.join(work_uri, JOURNAL_NAME)
    tmp = tempfile.mkdtemp(prefix="gpupipe-tune-")
    path = os.path.join(tmp, JOURNAL_NAME)
    if storage.exists(remote):
        with open(path, "wb") as f:
            f.write(storage.read_bytes(remote))
    lock = threading.Lock()

    def save() -> None:
        with lock, open(path, "rb") as f:
            data = f.read()
        storage.write_bytes(remote, data[: data.rfind(b"\n") + 1])

    try:
        yield path, save
        save()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _open_study(path: str, name: str, space: SearchSpace, seed: int) -> optuna.Study:
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    backend = JournalFileBackend(path, lock_obj=JournalFileOpenLock(path + ".lock"))
    storage_ = optuna.storages.JournalStorage(backend)
    direction: Literal["minimize", "maximize"] = (
        "maximize" if space.objective.type == "maximize" else "minimize"
    )
    study = optuna.create_study(
        storage=storage_,
        study_name=name,
        direction=direction,
        load_if_exists=True,
        pruner=make_pruner(space),
        sampler=optuna.samplers.RandomSampler(),  # replaced below, once the trials are known
    )
    if study.direction.name.lower() != direction:
        raise InputError(
            "E_CONFIG",
            f"study {name} in {path} optimises in direction {study.direction.name.lower()}, "
            f"the space says {direction}",
            "tune.objective.type",
        )
    # A seeded sampler would redraw the first attempt's points after a retry: offset the seed
    # by the trials already in the study.
    study.sampler = make_sampler(space, seed=seed + 7919 * len(study.trials))
    return study


def _resume(study: optuna.Study) -> list[int]:
    """Mark trials a killed attempt left running as failed and queue them again."""
    from optuna.trial import TrialState

    interrupted = list(study.user_attrs.get(_INTERRUPTED_ATTR, []))
    requeue = []
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.RUNNING:
            study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            requeue.append(t)
        elif (
            t.state == TrialState.FAIL
            and t.user_attrs.get("interrupted")
            and t.number not in interrupted
        ):
            requeue.append(t)
    for t in requeue:
        interrupted.append(t.number)
        # A trial killed before its first suggestion has only its queued values, if any.
        params = dict(t.params) or dict(t.system_attrs.get("fixed_params", {}))
        study.enqueue_trial(params, user_attrs={"requeued_from": t.number})
    if requeue:
        study.set_user_attr(_INTERRUPTED_ATTR, sorted(interrupted))
    return [t.number for t in requeue]


def _records(study: optuna.Study, metric: str) -> list[TrialRecord]:
    from optuna.trial import TrialState

    interrupted = set(study.user_attrs.get(_INTERRUPTED_ATTR, []))
    out = []
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.WAITING:
            continue
        out.append(
            TrialRecord(
                number=t.number,
                state=t.state.name,
                value=t.value if t.state == TrialState.COMPLETE else None,
                params=dict(t.user_attrs.get("assignment", t.params)),
                epochs=t.user_attrs.get("epochs"),
                intermediate=sorted((int(s), float(v)) for s, v in t.intermediate_values.items()),
                metrics=dict(t.user_attrs.get("metrics", {})),
                error=t.user_attrs.get("error"),
                interrupted=t.number in interrupted or bool(t.user_attrs.get("interrupted")),
            )
        )
    return out


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


def _failed(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    from optuna.trial import TrialState

    interrupted = set(study.user_attrs.get(_INTERRUPTED_ATTR, []))
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
        if t.number not in interrupted and not t.user_attrs.get("interrupted")
    ]


def _finished(study: optuna.Study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def _too_many_failed(failed: list[optuna.trial.FrozenTrial], limit: int) -> TooManyFailedTrials:
    last = failed[-1]
    why = last.user_attrs.get("error", "no message")
    return TooManyFailedTrials(
        f"{len(failed)} trials failed, more than tune.maxFailedTrialCount={limit}; "
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
        TooManyFailedTrials: more than ``maxFailedTrialCount`` trials failed.
        TrialInterrupted: the step got SIGTERM; running trials were stopped (resumable).
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    metric = space.objective.objectiveMetricName
    with _study_file(work_uri) as (path, save):
        study = _open_study(path, study_name, space, seed)
        _log_resume(study, study_name, metric, requeued=_resume(study), path=path)
        _raise_if_too_many_failed(study, space)
        remaining = space.maxTrialCount - _finished(study) - len(_failed(study))
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
    records = _records(study, metric)
    if records:
        log.info(
            "resuming study %s: %d trials finished before, %d re-queued (%s)",
            study_name,
            sum(r.state in ("COMPLETE", "PRUNED", "FAIL") and not r.interrupted for r in records),
            len(requeued),
            path,
        )


def _raise_if_too_many_failed(study: optuna.Study, space: SearchSpace) -> None:
    failed = _failed(study)
    if len(failed) > space.maxFailedTrialCount:
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
            fails = _failed(st)
            best = _best(st)
            log.info(
                "trial %d %s%s; %d/%d finished, %d failed, best %s",
                trial.number,
                trial.state.name.lower(),
                f" {space.objective.objectiveMetricName}={trial.value:.6g}"
                if trial.value is not None
                else "",
                _finished(st) + len(fails),
                space.maxTrialCount,
                len(fails),
                f"{best[1]:.6g} (trial {best[0]})" if best else "none yet",
            )
            if len(fails) > space.maxFailedTrialCount:
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
        _finished(study) + len(_failed(study)) < space.maxTrialCount
    ):
        reason = f"timeout: no new trials after {timeout_s} s"
    if _grid_exhausted(study, space):
        reason = "grid exhausted"
    best = _best(study)
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
        trials=_records(study, space.objective.objectiveMetricName),
        importances=_importances(study),
        stopped_reason=reason,
    )


def _best(study: optuna.Study) -> tuple[int, float] | None:
    from optuna.trial import TrialState

    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    t = study.best_trial
    return t.number, float(t.value) if t.value is not None else math.nan


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
