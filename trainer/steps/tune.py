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

import datetime as dt
import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING, Any, Literal

from trainer import outputs, storage
from trainer.config import WorkerConfig, apply_overrides, from_dict, require, to_json
from trainer.errors import InputError
from trainer.steps.train import TrainStepConfig, build_worker_config, read_schema, record_fixed
from trainer.tune.space import (
    SearchSpace,
    config_fields,
    example_space,
    load_space,
    trial_overrides,
)
from trainer.version import __version__

if TYPE_CHECKING:
    from trainer.tune.katib import KatibLauncher
    from trainer.tune.local import StudyResult, TrialRecord, TrialRunner

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
    sections, ``nproc_per_node``, ``cluster`` for katib), as the train step takes them."""
    trial_epochs: int | None = None
    """Epochs of each trial (``train.epochs``), unless the space searches it; ``None`` keeps
    the base setting. Trials are usually shorter than the final training."""
    seed: int = 0
    """Seed of the local sampler (an algorithm's ``random_state`` setting wins)."""
    runner: Literal["subprocess", "in_process"] = "subprocess"
    """Local engine: trials as ``trainer.worker`` processes (torchrun when nproc_per_node > 1),
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


@dataclass
class TuneStepResult:
    """What the search found, in the shape the component outputs."""

    engine: str
    objective_metric: str
    direction: str
    best_params: dict[str, Any]
    """Dotted config field -> value: the train step's ``hyperparams_json``."""
    best_value: float | None
    trials_completed: int
    trials_pruned: int
    trials_failed: int
    stopped_reason: str = ""
    study: str = ""
    """The local study's name or the Katib Experiment's ``namespace/name``."""

    def metrics(self) -> dict[str, float]:
        """The numbers for a KFP Metrics artifact."""
        out = {
            "trials_completed": float(self.trials_completed),
            "trials_pruned": float(self.trials_pruned),
            "trials_failed": float(self.trials_failed),
        }
        if self.best_value is not None:
            out[f"best_{self.objective_metric}"] = self.best_value
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "objective_metric": self.objective_metric,
            "direction": self.direction,
            "best_params": dict(self.best_params),
            "best_value": self.best_value,
            "trials_completed": self.trials_completed,
            "trials_pruned": self.trials_pruned,
            "trials_failed": self.trials_failed,
            "stopped_reason": self.stopped_reason,
            "study": self.study,
        }


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
        RuntimeError: more than ``maxFailedTrialCount`` trials failed, or the Experiment failed.
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
            else SubprocessTrialRunner(nproc_per_node=step_cfg.nproc_per_node)
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
        nproc_per_node=step_cfg.nproc_per_node,
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
    from trainer.launch.pytorchjob import build_pytorchjob
    from trainer.steps.train import job_spec
    from trainer.tune.katib import KatibLauncher, build_experiment, experiment_name

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
    if launcher is None:
        launcher = KatibLauncher.from_environment(namespace=step_cfg.cluster.namespace)
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
    trial_job = build_pytorchjob(
        job_spec(step_cfg, name=name, namespace=launcher.namespace, config_uri=config_uri)
    )
    experiment = build_experiment(
        space,
        name=name,
        namespace=launcher.namespace,
        trial_job=trial_job,
        base_overrides={},
        trial_uri=storage.join(work_uri, "trials"),
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


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

_CSS_EXTRA = """
td.err{text-align:left;max-width:28rem;word-break:break-word;color:#cf222e}
tr.best{font-weight:bold;background:#fff8c5}
.state-PRUNED{color:#59636e}.state-FAIL{color:#cf222e}
"""


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    return str(value)


def history_png(trials: list[TrialRecord], *, metric: str, maximize: bool) -> str | None:
    """Objective per trial (completed: dots; pruned: their last report, crosses) and the
    best-so-far line, as base64 PNG; None when no trial reported anything."""
    from trainer.steps.figures import figure, png

    done = [(t.number, t.value) for t in trials if t.state == "COMPLETE" and t.value is not None]
    pruned = [
        (t.number, t.intermediate[-1][1]) for t in trials if t.state == "PRUNED" and t.intermediate
    ]
    if not done and not pruned:
        return None
    fig = figure(7.5, 4.0)
    ax = fig.add_subplot()
    if done:
        ax.scatter(*zip(*done, strict=True), label="completed trial", color="#0969da", zorder=3)
        best: list[tuple[int, float]] = []
        current: float | None = None
        for n, v in sorted(done):
            if current is None or (v > current if maximize else v < current):
                current = v
            best.append((n, current))
        xs, ys = zip(*best, strict=True)
        ax.step(xs, ys, where="post", color="#cf222e", label="best so far")
    if pruned:
        ax.scatter(
            *zip(*pruned, strict=True),
            marker="x",
            color="#8c959f",
            label="pruned (last report)",
            zorder=2,
        )
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title("Optimisation history")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    return png(fig)


def importance_png(importances: dict[str, float]) -> str | None:
    """Parameter importances as a horizontal bar chart (base64 PNG)."""
    from trainer.steps.figures import figure, png

    if not importances:
        return None
    items = sorted(importances.items(), key=lambda kv: kv[1])
    fig = figure(7.5, 0.5 * len(items) + 1.4)
    ax = fig.add_subplot()
    ax.barh([k for k, _ in items], [v for _, v in items], color="#1a7f37")
    for i, (_, v) in enumerate(items):
        ax.text(v, i, f" {v:.2f}", va="center", fontsize="small")
    ax.set_xlabel("importance (fANOVA, completed trials)")
    ax.set_xlim(0, max(1.0, max(v for _, v in items) * 1.15))
    ax.set_title("Parameter importances")
    return png(fig)


def _trials_table(study: StudyResult) -> str:
    names = sorted({k for t in study.trials for k in t.params})
    head = "".join(
        f"<th>{escape(h)}</th>"
        for h in ["trial", "state", study.objective_metric, "epochs", *names, "error"]
    )
    rows = []
    for t in study.trials:
        state = t.state + (" (interrupted, re-run)" if t.interrupted else "")
        cls = ' class="best"' if t.number == study.best_trial else ""
        value = (
            t.value if t.value is not None else (t.intermediate[-1][1] if t.intermediate else None)
        )
        cells = [
            str(t.number),
            f'<span class="state-{escape(t.state)}">{escape(state)}</span>',
            "–" if value is None else escape(_fmt(value)) + ("" if t.value is not None else "*"),
            "–" if t.epochs is None else escape(_fmt(float(t.epochs))),
            *(escape(_fmt(t.params[n])) if n in t.params else "–" for n in names),
        ]
        row = "".join(f"<td>{c}</td>" for c in cells)
        row += f'<td class="err">{escape(t.error or "")}</td>'
        rows.append(f"<tr{cls}>{row}</tr>")
    return (
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        '<p class="note">* a pruned trial\'s last reported value.</p>'
    )


def render_tune_report(
    result: TuneStepResult,
    study: StudyResult | None,
    *,
    dataset_uri: str,
    work_uri: str,
) -> str:
    """The report page: best parameters, history and importance pictures, the trials.

    Self-contained (pictures are embedded PNGs) and every piece of text is HTML-escaped.
    """
    import matplotlib

    from trainer.steps.figures import CSS, img

    maximize = result.direction == "maximize"
    parts = ["<h2>Best parameters</h2>"]
    rows = "".join(
        f"<tr><td>{escape(k)}</td><td>{escape(_fmt(v))}</td></tr>"
        for k, v in sorted(result.best_params.items())
    )
    parts.append(
        f"<table><thead><tr><th>field</th><th>value</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    with matplotlib.rc_context({"text.parse_math": False}):
        if study is not None:
            parts.append("<h2>Optimisation history</h2>")
            png = history_png(study.trials, metric=result.objective_metric, maximize=maximize)
            parts.append(
                img(png, f"{result.objective_metric} per trial, with the best so far")
                if png
                else '<p class="note">No trial reported the objective.</p>'
            )
            parts.append("<h2>Parameter importances</h2>")
            imp = importance_png(study.importances or {})
            parts.append(
                img(imp, "parameter importances")
                if imp
                else '<p class="note">Too few completed trials to estimate importances.</p>'
            )
            parts.append("<h2>Trials</h2>")
            parts.append(_trials_table(study))
        else:
            parts.append(
                '<p class="note">Trials ran as a Katib Experiment: see its trials in the Katib '
                "UI; this page shows the outcome only.</p>"
            )
    created = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    best = "none" if result.best_value is None else _fmt(result.best_value)
    facts = [
        ("engine", result.engine),
        ("study", result.study),
        ("objective", f"{result.direction} {result.objective_metric}"),
        ("best", best),
        (
            "trials",
            f"{result.trials_completed} completed, {result.trials_pruned} pruned, "
            f"{result.trials_failed} failed",
        ),
        ("ended because", result.stopped_reason),
        ("dataset", dataset_uri),
        ("work area", work_uri),
        ("written", f"{created} by gpupipe {__version__}"),
    ]
    facts_html = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in facts)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Tune: best {escape(result.objective_metric)} {escape(best)}</title>"
        f"<style>{CSS}{_CSS_EXTRA}</style></head><body>"
        "<h1>Hyperparameter search report</h1>"
        f'<p class="sub">{escape(result.direction)} {escape(result.objective_metric)}</p>'
        f"<dl>{facts_html}</dl>"
        f"{''.join(parts)}</body></html>\n"
    )


__all__ = [
    "TUNABLE_SECTIONS",
    "TuneConfig",
    "TuneStepResult",
    "render_tune_report",
    "trial_worker_config",
    "tunable_fields",
    "tune",
]
