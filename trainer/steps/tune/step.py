"""The tune step: search hyperparameters (an Optuna study here, or a Katib Experiment), report.

The search space is written once in Katib's vocabulary (:mod:`trainer.tune.space`); parameters
are dotted fields of the train step's ``model``, ``optim`` and ``train`` sections. Each trial is
the train step's own worker config (same data, same base settings) plus the trial's values, so
the best parameters can be handed to the train step unchanged, as its ``hyperparams_json``.

Outputs (each written only when the search succeeded): the best parameters as a JSON object
(dotted field -> value), a metrics JSON (best objective and trial counts) and a self-contained
HTML report with the optimisation history and the parameter importances as pictures.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from trainer.base import outputs, storage
from trainer.base.errors import InputError
from trainer.base.typedconfig import apply_overrides, config_fields, from_dict, require, to_json
from trainer.config import WorkerConfig
from trainer.launch import processes_per_node
from trainer.steps.train import TrainStepConfig, build_worker_config, read_schema, record_fixed
from trainer.steps.tune.report import TuneStepResult, disabled_report, render_tune_report
from trainer.tune.space import SearchSpace, example_space, load_space
from trainer.tune.values import trial_overrides

if TYPE_CHECKING:
    from trainer.tune.katib import KatibLauncher
    from trainer.tune.local import StudyResult, TrialRunner

log = logging.getLogger(__name__)
WORK_STEP = "tune-work"
"""The marker step of the work folder (study journal, trials): only tune reuses it."""

TUNABLE_SECTIONS = ("model", "optim", "train")
"""Config sections a search may vary; data, output and cluster settings belong to the step."""


def tunable_fields() -> set[str]:
    """Dotted config fields a search space may name (``optim.lr``, ``model.hidden_dim``, ...)."""
    return {f for f in config_fields(TrainStepConfig) if f.split(".")[0] in TUNABLE_SECTIONS}


@dataclass(kw_only=True, slots=True)
class TuneConfig:
    """What the tune step searches, with which engine, over which base training settings."""

    engine: Literal["local", "katib"] = "local"
    """``local``: an Optuna study whose trials run here; ``katib``: a Katib Experiment."""
    space: dict[str, Any] = field(default_factory=example_space)
    """The search space in Katib's Experiment vocabulary (see ``trainer.tune.space``)."""
    train: dict[str, Any] = field(default_factory=dict)
    """Base train-step settings every trial starts from (``model``/``optim``/``train``
    sections, ``gpus_per_node``, ``cluster`` for katib), as the train step takes them."""
    trial_epochs: int | None = None
    """Epochs of each trial (``train.epochs``), unless the space searches it; ``None`` keeps
    the base setting. Trials are usually shorter than the final training."""
    seed: int = 0
    """Seed of the local sampler (an algorithm's ``random_state`` setting wins)."""
    runner: Literal["subprocess", "in_process"] = "subprocess"
    """Local engine: trials as ``trainer.worker`` processes (torchrun when gpus_per_node > 1),
    or ``train()`` calls in this process (one at a time; quick for tiny searches)."""
    timeout_s: int | None = None
    """Local: start no new trial after this many seconds; katib: the Experiment's deadline."""

    def __post_init__(self) -> None:
        require(
            self.trial_epochs is None or self.trial_epochs > 0,
            "tune.trial_epochs",
            "must be > 0 or null",
            self.trial_epochs,
        )
        require(
            self.timeout_s is None or self.timeout_s > 0,
            "tune.timeout_s",
            "must be > 0 or null",
            self.timeout_s,
        )
        self.parsed_space()
        self.base_step_config()

    def parsed_space(self) -> SearchSpace:
        """The validated search space (parameters checked against :func:`tunable_fields`)."""
        return load_space(self.space, config_fields=tunable_fields(), where="tune.space")

    def base_step_config(self) -> TrainStepConfig:
        """The train-step config every trial starts from (``trial_epochs`` applied)."""
        settings = apply_overrides(self.train, self.base_overrides())
        return from_dict(TrainStepConfig, record_fixed(settings))

    def base_overrides(self) -> dict[str, Any]:
        """Overrides of the step itself on top of ``train`` (not searched fields)."""
        searched = {p.get("name") for p in self.space.get("parameters", [])}
        if self.trial_epochs is not None and "train.epochs" not in searched:
            return {"train.epochs": self.trial_epochs}
        return {}

    def study_name(self) -> str:
        """Deterministic name of the local study: a retried step with the same search resumes
        it. Trial counts may change between attempts (as on a Katib Experiment)."""
        counts = ("maxTrialCount", "parallelTrialCount", "maxFailedTrialCount")
        key = {
            "space": {k: v for k, v in self.space.items() if k not in counts},
            "train": self.train,
            "trial_epochs": self.trial_epochs,
            "seed": self.seed,
        }
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode())
        return f"tune-{digest.hexdigest()[:12]}"


def trial_worker_config(
    cfg: TuneConfig, assignment: dict[str, Any], *, dataset_uri: str, trial_uri: str
) -> tuple[WorkerConfig, TrainStepConfig]:
    """A trial's worker config: the base settings plus the trial's values, its own folders.

    Raises:
        InputError: the trial's values make an invalid config (that trial fails).
    """
    data = apply_overrides(cfg.train, cfg.base_overrides())
    settings = apply_overrides(data, trial_overrides(assignment))
    step_cfg = from_dict(TrainStepConfig, record_fixed(settings))  # searched values win
    worker = build_worker_config(
        step_cfg,
        dataset_uri=dataset_uri,
        model_uri=storage.join(trial_uri, "model"),
        work_uri=trial_uri,
    )
    return worker, step_cfg


def tune(
    cfg: TuneConfig,
    *,
    dataset_uri: str,
    work_uri: str,
    output_uri: str,
    report_uri: str,
    metrics_uri: str | None = None,
    runner: TrialRunner | None = None,
    launcher: KatibLauncher | None = None,
    run_id: str = "local",
    task_name: str = "tune",
) -> TuneStepResult:
    """Search, then write the best parameters (JSON), the metrics and the report.

    Args:
        cfg: The search and its base training settings.
        dataset_uri: The preprocessed dataset (with ``schema.json``).
        work_uri: The step's working area, stable across retries: the local study's journal
            and each trial's folder (``trials/<number>/``) live here, so a retried step resumes.
            For katib it must be a URI the trial pods can reach (object store).
        output_uri: The best parameters as a JSON object (a file).
        report_uri: The HTML report (a file).
        metrics_uri: Optionally, the metrics as JSON (a file).
        runner: Local engine: runs the trials (default per ``cfg.runner``).
        launcher: Katib engine: the launcher (default: from the pod's environment).
        run_id: KFP run id (names the Katib Experiment).
        task_name: KFP task name (names the Katib Experiment).

    Returns:
        What the search found.

    Raises:
        InputError: bad space, settings or dataset (before any trial runs).
        RuntimeError: the failed trials reached ``maxFailedTrialCount``, or the Experiment failed.
    """
    # Before any work: the outputs must be new or this step's own (the work folder is claimed,
    # new, empty or ours, by each engine before its first trial).
    inputs = {"dataset": dataset_uri, "work folder": work_uri}
    for out in (output_uri, report_uri, metrics_uri):
        if out is not None:
            outputs.check_output_location(out, "tune", inputs=inputs, kind="file")
    space = cfg.parsed_space()
    step_cfg = cfg.base_step_config()
    read_schema(dataset_uri)  # a dataset without a schema fails here, not in every trial
    if cfg.engine == "katib":
        study = None
        result = _tune_katib(
            cfg, space, step_cfg, dataset_uri, work_uri, launcher, run_id, task_name
        )
    else:
        study = _tune_local(cfg, space, step_cfg, dataset_uri, work_uri, runner)
        result = TuneStepResult(
            engine="local",
            objective_metric=study.objective_metric,
            direction=study.direction,
            best_params=study.best_params,
            best_value=study.best_value,
            trials_completed=study.count("COMPLETE"),
            trials_pruned=study.count("PRUNED"),
            trials_failed=study.count("FAIL"),
            stopped_reason=study.stopped_reason,
            study=study.study_name,
        )
    if not result.best_params:
        raise RuntimeError(
            f"the search finished without a completed trial ({result.trials_pruned} pruned, "
            f"{result.trials_failed} failed): there are no best parameters"
        )
    html = render_tune_report(result, study, dataset_uri=dataset_uri, work_uri=work_uri)
    outputs.write_output_file(report_uri, html, step="tune")
    if metrics_uri is not None:
        metrics_json = json.dumps(result.metrics(), indent=2, sort_keys=True)
        outputs.write_output_file(metrics_uri, metrics_json, step="tune")
    best_json = json.dumps(result.best_params, indent=2, sort_keys=True)
    outputs.write_output_file(output_uri, best_json, step="tune")
    log.info(
        "tune: best %s=%s with %s (%d completed, %d pruned, %d failed; %s)",
        result.objective_metric,
        result.best_value,
        json.dumps(result.best_params, sort_keys=True),
        result.trials_completed,
        result.trials_pruned,
        result.trials_failed,
        result.stopped_reason,
    )
    return result


def _tune_local(
    cfg: TuneConfig,
    space: SearchSpace,
    step_cfg: TrainStepConfig,
    dataset_uri: str,
    work_uri: str,
    runner: TrialRunner | None,
) -> StudyResult:
    from trainer.tune.local import InProcessTrialRunner, SubprocessTrialRunner, run_study

    if step_cfg.launcher != "local" or step_cfg.nnodes != 1:
        raise InputError(
            "E_CONFIG",
            "the local tune engine runs trials on this machine: use launcher 'local' and "
            "nnodes 1 in tune.train (or engine 'katib' for a cluster)",
            "tune.train.launcher",
        )
    if runner is None:
        runner = (
            InProcessTrialRunner()
            if cfg.runner == "in_process"
            else SubprocessTrialRunner(nproc_per_node=processes_per_node(step_cfg.gpus_per_node))
        )

    def trial_config(number: int, assignment: dict[str, Any], trial_uri: str) -> WorkerConfig:
        return trial_worker_config(cfg, assignment, dataset_uri=dataset_uri, trial_uri=trial_uri)[0]

    outputs.claim_output_dir(work_uri, WORK_STEP, inputs={"dataset": dataset_uri})
    return run_study(
        space,
        trial_config,
        runner=runner,
        work_uri=work_uri,
        study_name=cfg.study_name(),
        seed=cfg.seed,
        nproc_per_node=processes_per_node(step_cfg.gpus_per_node),
        timeout_s=cfg.timeout_s,
    )


def _tune_katib(
    cfg: TuneConfig,
    space: SearchSpace,
    step_cfg: TrainStepConfig,
    dataset_uri: str,
    work_uri: str,
    launcher: KatibLauncher | None,
    run_id: str,
    task_name: str,
) -> TuneStepResult:
    """One Katib Experiment whose trials are the train launcher's PyTorchJob."""
    from trainer.launch.jobspec import JobSpec
    from trainer.launch.pytorchjob import build_pytorchjob
    from trainer.tune.katib import KatibLauncher, build_experiment, experiment_name
    from trainer.tune.space import CLUSTER_ALGORITHMS, CLUSTER_DISTRIBUTIONS

    if not step_cfg.cluster.image:
        raise InputError(
            "E_CONFIG",
            "engine 'katib' needs the trial image: set tune.train.cluster.image",
            "tune.train.cluster.image",
        )
    if storage.local_path(work_uri) is not None:
        raise InputError(
            "E_CONFIG",
            "engine 'katib' needs a work URI the trial pods can reach (s3://, gs://, minio://)",
            work_uri,
        )
    algorithm = space.algorithm.algorithmName
    if algorithm not in CLUSTER_ALGORITHMS:
        raise InputError(
            "E_CONFIG",
            f"algorithm {algorithm!r} has no Katib suggestion service on a cluster: use one of "
            f"{', '.join(CLUSTER_ALGORITHMS)} with engine 'katib' (or engine 'local')",
            "tune.space.algorithm.algorithmName",
        )
    for i, p in enumerate(space.parameters):
        distribution = p.feasibleSpace.distribution
        if distribution not in (None, *CLUSTER_DISTRIBUTIONS):
            raise InputError(
                "E_CONFIG",
                f"parameter {p.name!r}: distribution {distribution!r} has no sampler in Katib's "
                f"suggestion service (it would leave the trial without a value): use "
                f"{' or '.join(CLUSTER_DISTRIBUTIONS)} with engine 'katib' (or engine 'local')",
                f"tune.space.parameters[{i}].feasibleSpace.distribution",
            )
    if launcher is None:
        # An Experiment cannot be suspended: on_exit=suspend keeps it, as keep does.
        on_exit = "delete" if step_cfg.cluster.on_exit == "delete" else "keep"
        launcher = KatibLauncher.from_environment(
            namespace=step_cfg.cluster.namespace, on_exit=on_exit, poll_s=5.0
        )
    name = experiment_name(run_id, task_name)
    outputs.claim_output_dir(work_uri, WORK_STEP, inputs={"dataset": dataset_uri})
    base = build_worker_config(
        step_cfg,
        dataset_uri=dataset_uri,
        model_uri=storage.join(work_uri, "model"),
        work_uri=work_uri,
    )
    config_uri = storage.join(work_uri, "worker-config.json")
    storage.write_text(config_uri, to_json(base))
    run = step_cfg.training_run(job_name=name, config_uri=config_uri)
    trial_job = build_pytorchjob(
        JobSpec(namespace=launcher.namespace, run=run, cluster=step_cfg.cluster)
    )
    experiment = build_experiment(
        space,
        name=name,
        namespace=launcher.namespace,
        trial_job=trial_job,
        base_overrides={},
        trial_uri=storage.join(work_uri, "trials"),
        # With early stopping, Katib v0.19 copies a stopped trial's metrics into its status only
        # while the trial's job exists; retain=false deletes the job at once, and a lost status
        # update (a conflict, common here) then leaves the trial without an observation, and
        # Katib asks for no further trial: the search stalls. Kept jobs go with the Experiment.
        retain_trials=space.earlyStopping is not None,
    )
    found = launcher.run(experiment, space, timeout_s=cfg.timeout_s)
    counts = found.trials
    return TuneStepResult(
        engine="katib",
        objective_metric=space.objective.objectiveMetricName,
        direction=space.objective.type,
        best_params=dict(found.best_parameters),
        best_value=found.best_value,
        trials_completed=int(counts.get("succeeded", 0)),
        trials_pruned=int(counts.get("early_stopped", 0)),
        trials_failed=int(counts.get("failed", 0)),
        stopped_reason=found.reason,
        study=found.experiment,
    )


def tune_disabled(*, output_uri: str, report_uri: str) -> None:
    """The outputs of a switched-off search: no parameters (``{}``) and a report that says so.

    A pipeline can then always wire tune's output into train (kfp.local cannot join
    conditional branches), and train runs with its own settings.
    """
    outputs.write_output_file(output_uri, "{}\n", step="tune")
    outputs.write_output_file(report_uri, disabled_report(), step="tune")


__all__ = [
    "TUNABLE_SECTIONS",
    "TuneConfig",
    "trial_worker_config",
    "tunable_fields",
    "tune",
    "tune_disabled",
]
