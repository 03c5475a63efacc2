"""The local tune engine: a Katib-style search space run as an Optuna study over real trainings.

Katib's algorithms map onto Optuna samplers and its median stopping (or Hyperband) onto pruners
(:data:`SAMPLERS`, :data:`PRUNERS`). Each trial is a real training run of ``trainer.loop``,
driven by a :class:`TrialRunner`: a ``trainer.worker`` subprocess whose JSON ``eval`` lines are
reported to the trial as they appear (:class:`SubprocessTrialRunner`), or a call of
``trainer.loop.train`` in this process (:class:`InProcessTrialRunner`, for tests and benchmarks).
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

from trainer import storage
from trainer.config import WorkerConfig
from trainer.errors import InputError
from trainer.tune.runners import (
    InProcessTrialRunner,
    SubprocessTrialRunner,
    TrialFailed,
    TrialInterrupted,
    TrialOutcome,
    TrialRunner,
    is_number,
)
from trainer.tune.space import Parameter, SearchSpace, grid_points, sample_value

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

JOURNAL_NAME = "study.journal"
"""File of the study inside the work URI."""

SAMPLERS: dict[str, str] = {
    "random": "RandomSampler",
    "grid": "GridSampler",
    "tpe": "TPESampler",
    "multivariate-tpe": "TPESampler(multivariate=True)",
    "cmaes": "CmaEsSampler",
    "bayesianoptimization": "GPSampler",
    "hyperband": "TPESampler (+ HyperbandPruner)",
}
"""Katib algorithm -> the Optuna sampler that plays its part."""
PRUNERS: dict[str | None, str] = {
    None: "NopPruner",
    "medianstop": "MedianPruner(n_startup_trials=min_trials_required, n_warmup_steps=start_step)",
    "hyperband": "HyperbandPruner(min_resource, max_resource, reduction_factor=eta)",
}
"""Katib early stopping (or the hyperband algorithm) -> the Optuna pruner."""

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
# Samplers, pruners, distributions
# --------------------------------------------------------------------------------------------


def _int_setting(space: SearchSpace, name: str, default: int | None) -> int | None:
    value = space.setting(name)
    return default if value is None else int(float(value))


def _float_setting(space: SearchSpace, name: str, default: float | None) -> float | None:
    value = space.setting(name)
    return default if value is None else float(value)


def make_sampler(space: SearchSpace, *, seed: int) -> optuna.samplers.BaseSampler:
    """The Optuna sampler of the space's algorithm (see :data:`SAMPLERS`).

    ``random_state`` in the algorithm settings overrides ``seed``.

    Raises:
        InputError: the algorithm needs a package that is not installed (cmaes).
    """
    import optuna

    algo = space.algorithm.algorithmName
    seed = _int_setting(space, "random_state", seed) or 0
    samplers = optuna.samplers
    if algo == "random":
        return samplers.RandomSampler(seed=seed)
    if algo == "grid":
        axes: dict[str, list[Any]] = {p.name: [] for p in space.parameters}
        for point in grid_points(space):
            for k, v in point.items():
                if v not in axes[k]:
                    axes[k].append(v)
        return samplers.GridSampler(axes, seed=seed)
    if algo in ("tpe", "multivariate-tpe", "hyperband"):
        kwargs: dict[str, Any] = {"seed": seed}
        if (n := _int_setting(space, "n_startup_trials", None)) is not None:
            kwargs["n_startup_trials"] = n
        if (n := _int_setting(space, "n_ei_candidates", None)) is not None:
            kwargs["n_ei_candidates"] = n
        if (w := _float_setting(space, "prior_weight", None)) is not None:
            kwargs["prior_weight"] = w
        if (g := _float_setting(space, "gamma", None)) is not None:
            share = g  # hyperopt's gamma: the share of trials that count as good

            def gamma(n: int) -> int:
                return min(math.ceil(share * n), 25)

            kwargs["gamma"] = gamma
        if algo == "multivariate-tpe":
            kwargs["multivariate"] = True
        return samplers.TPESampler(**kwargs)
    if algo == "cmaes":
        try:
            import cmaes  # noqa: F401  (optuna imports it lazily, at the first sample)
        except ImportError:
            raise InputError(
                "E_CONFIG",
                "algorithm cmaes needs the Python package 'cmaes' (pip install cmaes), "
                "which is not installed in this image",
                "tune.algorithm.algorithmName",
            ) from None
        return samplers.CmaEsSampler(
            seed=seed,
            sigma0=_float_setting(space, "sigma", None),
            restart_strategy=space.setting("restart_strategy"),
        )
    if algo == "bayesianoptimization":
        ignored = [
            s.name for s in space.algorithm.algorithmSettings if s.name not in ("random_state",)
        ]
        ignored = [n for n in ignored if n != "n_initial_points"]
        if ignored:
            log.info(
                "bayesianoptimization: settings %s have no Optuna GPSampler equivalent", ignored
            )
        return samplers.GPSampler(
            seed=seed, n_startup_trials=_int_setting(space, "n_initial_points", 10) or 10
        )
    raise AssertionError(f"unhandled algorithm {algo}")  # validate_space rejects others


def _resource(space: SearchSpace) -> Parameter | None:
    """Hyperband's resource parameter (fixed at its max; the pruner cuts trials short)."""
    if space.algorithm.algorithmName != "hyperband":
        return None
    name = space.setting("resource_name")
    return next((p for p in space.parameters if p.name == name), None)


def make_pruner(space: SearchSpace) -> optuna.pruners.BasePruner:
    """The Optuna pruner of the space's early stopping or Hyperband (see :data:`PRUNERS`)."""
    import optuna

    res = _resource(space)
    if res is not None:
        lo = max(1, math.floor(float(res.feasibleSpace.min or 1)))
        hi = max(
            lo, math.floor(float(_float_setting(space, "r_l", None) or res.feasibleSpace.max or lo))
        )
        eta = _float_setting(space, "eta", 3.0) or 3.0
        return optuna.pruners.HyperbandPruner(
            min_resource=lo, max_resource=hi, reduction_factor=max(2, round(eta))
        )
    if space.earlyStopping is not None:
        return optuna.pruners.MedianPruner(
            n_startup_trials=int(space.early_stopping_setting("min_trials_required", "3") or 3),
            n_warmup_steps=int(space.early_stopping_setting("start_step", "4") or 4),
        )
    return optuna.pruners.NopPruner()


def suggest(trial: optuna.trial.Trial, space: SearchSpace) -> dict[str, Any]:
    """Draw one assignment: dotted config field -> value typed for the config.

    Katib's ``normal``/``logNormal`` have no Optuna counterpart: they are drawn uniformly
    (log-uniformly) over ``min``..``max``. Grid search draws every parameter from its grid axis.
    """
    out: dict[str, Any] = {}
    res = _resource(space)
    grid = space.algorithm.algorithmName == "grid"
    axes = _grid_axes(space) if grid else {}
    for p in space.parameters:
        fs = p.feasibleSpace
        if res is not None and p.name == res.name:
            out[p.name] = sample_value(p, fs.max)
            continue
        if grid:
            raw: Any = trial.suggest_categorical(p.name, axes[p.name])
        elif p.parameterType in ("discrete", "categorical"):
            choices = [sample_value(p, v) for v in fs.list or []]
            raw = trial.suggest_categorical(p.name, choices)
        else:
            log_scale = fs.distribution in ("logUniform", "logNormal")
            lo, hi = float(fs.min or 0), float(fs.max or 0)
            step = float(fs.step) if fs.step is not None and not log_scale else None
            if p.parameterType == "int":
                raw = trial.suggest_int(
                    p.name, int(lo), int(hi), step=int(step or 1), log=log_scale
                )
            else:
                raw = trial.suggest_float(p.name, lo, hi, step=step, log=log_scale)
        out[p.name] = sample_value(p, raw)
    return out


def _grid_axes(space: SearchSpace) -> dict[str, list[Any]]:
    axes: dict[str, list[Any]] = {p.name: [] for p in space.parameters}
    for point in grid_points(space):
        for k, v in point.items():
            if v not in axes[k]:
                axes[k].append(v)
    return axes


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
    with _study_file(work_uri) as (path, save):
        study = _open_study(path, study_name, space, seed)
        requeued = _resume(study)
        records = _records(study, space.objective.objectiveMetricName)
        if records:
            log.info(
                "resuming study %s: %d trials finished before, %d re-queued (%s)",
                study_name,
                sum(
                    r.state in ("COMPLETE", "PRUNED", "FAIL") and not r.interrupted for r in records
                ),
                len(requeued),
                path,
            )
        failed = _failed(study)
        if len(failed) > space.maxFailedTrialCount:
            raise _too_many_failed(failed, space.maxFailedTrialCount)
        remaining = space.maxTrialCount - _finished(study) - len(failed)
        reason = _stop_reason(study, space)
        jobs = max(1, min(space.parallelTrialCount, runner.capacity))
        if jobs < space.parallelTrialCount:
            log.info(
                "running %d trials at a time (parallelTrialCount %d; this machine fits %d)",
                jobs,
                space.parallelTrialCount,
                runner.capacity,
            )
        state = {"reason": reason or "maxTrialCount reached"}
        lock = threading.Lock()

        def after_trial(st: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
            with lock:
                save()
                fails = _failed(st)
                done = _finished(st) + len(fails)
                best = _best(st)
                log.info(
                    "trial %d %s%s; %d/%d finished, %d failed, best %s",
                    trial.number,
                    trial.state.name.lower(),
                    f" {space.objective.objectiveMetricName}={trial.value:.6g}"
                    if trial.value is not None
                    else "",
                    done,
                    space.maxTrialCount,
                    len(fails),
                    f"{best[1]:.6g} (trial {best[0]})" if best else "none yet",
                )
                if len(fails) > space.maxFailedTrialCount:
                    state["reason"] = "failed"
                    st.stop()
                elif (why := _stop_reason(st, space)) is not None:
                    state["reason"] = why
                    st.stop()

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
                    callbacks=[after_trial],
                )
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            save()
        failed = _failed(study)
        if len(failed) > space.maxFailedTrialCount:
            raise _too_many_failed(failed, space.maxFailedTrialCount)
        if state["reason"] == "maxTrialCount reached" and (
            _finished(study) + len(failed) < space.maxTrialCount
        ):
            state["reason"] = f"timeout: no new trials after {timeout_s} s"
        if _grid_exhausted(study, space):
            state["reason"] = "grid exhausted"
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
            stopped_reason=state["reason"],
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
