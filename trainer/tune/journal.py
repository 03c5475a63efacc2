"""The local study's journal: where it lives, how a retried step resumes it, what it holds.

The study is an Optuna journal file in the step's working area (``<work>/study.journal``);
an object-store work URI gets a copy after each trial and reads it back when a retried step
starts. Resuming marks the trials a killed attempt left running as failed (not counted as
failures) and queues them again with the same parameters. The rest reads the journal back: the
trials as the report shows them, the failed and finished ones, the best.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from trainer.base import storage
from trainer.base.errors import InputError
from trainer.tune.samplers import make_pruner, make_sampler
from trainer.tune.space import SearchSpace

if TYPE_CHECKING:
    import optuna

JOURNAL_NAME = "study.journal"
"""File of the study inside the work URI."""

INTERRUPTED_ATTR = "interrupted_trials"
"""Study user attribute: numbers of trials a killed attempt left unfinished (re-queued)."""


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


@contextlib.contextmanager
def study_file(work_uri: str) -> Iterator[tuple[str, Callable[[], None]]]:
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


def open_study(path: str, name: str, space: SearchSpace, seed: int) -> optuna.Study:
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


def requeue_interrupted(study: optuna.Study) -> list[int]:
    """Mark trials a killed attempt left running as failed and queue them again."""
    from optuna.trial import TrialState

    interrupted = list(study.user_attrs.get(INTERRUPTED_ATTR, []))
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
        study.set_user_attr(INTERRUPTED_ATTR, sorted(interrupted))
    return [t.number for t in requeue]


def records(study: optuna.Study, metric: str) -> list[TrialRecord]:
    from optuna.trial import TrialState

    interrupted = set(study.user_attrs.get(INTERRUPTED_ATTR, []))
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


def failed(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    from optuna.trial import TrialState

    interrupted = set(study.user_attrs.get(INTERRUPTED_ATTR, []))
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
        if t.number not in interrupted and not t.user_attrs.get("interrupted")
    ]


def finished(study: optuna.Study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def best(study: optuna.Study) -> tuple[int, float] | None:
    from optuna.trial import TrialState

    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    t = study.best_trial
    return t.number, float(t.value) if t.value is not None else math.nan
