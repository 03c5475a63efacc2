"""Run the training pipeline on this machine with ``kfp.local`` and summarise what it produced."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from trainer.errors import InputError

log = logging.getLogger(__name__)

DEMO_TARGET = "churned"


def pipeline_parameters() -> dict[str, Any]:
    """Names and defaults of the training pipeline's parameters (``None``: required)."""
    from pipelines.training import training_pipeline

    spec = training_pipeline.component_spec
    return {name: getattr(inp, "default", None) for name, inp in spec.inputs.items()}


def normalize_params(params: dict[str, Any]) -> dict[str, Any]:
    """Accept ``tune.enabled`` for the pipeline parameter ``tune_enabled`` (and so on)."""
    known = pipeline_parameters()
    out = {}
    for key, value in params.items():
        alias = key.replace(".", "_")
        out[alias if key not in known and alias in known else key] = value
    return out


def _check_params(params: dict[str, Any]) -> None:
    known = pipeline_parameters()
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise InputError(
            "E_PARAM",
            f"unknown pipeline parameter {unknown[0]!r}; known: {', '.join(sorted(known))}",
            "--param",
        )


def run_local(
    *, data: str | None, target: str | None, params: dict[str, Any], root: Path, quiet: bool = False
) -> dict[str, Any]:
    """Run ``training_pipeline`` under kfp.local (subprocess runner, caching on).

    Everything lands under ``root``: ``pipeline-root/`` (artifacts, cache), ``mlflow.db``
    (the embedded registry, shared by runs in the same root so later runs meet a champion) and
    ``demo/`` (generated data when ``data`` is not given).

    Returns:
        The run summary (state, metrics, gate, model URI, report, registry version).
    """
    from kfp import local

    from pipelines.training import PIPELINE_NAME, build_training_pipeline

    training_pipeline = build_training_pipeline(retries=0, cluster=False)

    params = normalize_params(params)
    _check_params(params)
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    if data is None:
        from trainer.steps.demo_data import write_demo_data

        data = str(root / "demo" / "churn.parquet")
        if not Path(data).exists():
            write_demo_data(data, rows=4000, task="classification", seed=0)
        target = target or DEMO_TARGET
    if not target:
        raise InputError("E_PARAM", "--target is required with --data", "--target")
    arguments: dict[str, Any] = {
        "data_uri": data,
        "target": target,
        "registry_uri": f"sqlite:///{root / 'mlflow.db'}",
    }
    arguments.update(params)
    _check_params(arguments)

    # Components run `python3 -m kfp.dsl.executor_main`: make that (and torchrun inside the
    # train step) the interpreter that has gpupipe installed.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    pipeline_root = root / "pipeline-root"
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(pipeline_root),
        enable_caching=True,
        raise_on_error=False,
    )
    before = set(pipeline_root.glob(f"{PIPELINE_NAME}-*")) if pipeline_root.exists() else set()
    if quiet:
        # --json: keep stdout for the summary line; kfp.local's progress goes to stderr.
        from contextlib import redirect_stdout

        with redirect_stdout(sys.stderr):
            task = training_pipeline(**arguments)
    else:
        task = training_pipeline(**arguments)
    runs = sorted(set(pipeline_root.glob(f"{PIPELINE_NAME}-*")) - before)
    if not runs:
        raise RuntimeError(f"kfp.local produced no run folder under {pipeline_root}")
    summary = summarize(runs[-1])
    summary["registry_uri"] = arguments["registry_uri"]
    summary["registered_model_name"] = arguments.get("registered_model_name", "gpupipe-model")
    summary["state"] = _state(task, summary)
    return summary


def _state(task: Any, summary: dict[str, Any]) -> str:
    status = summary.get("final_status", {}).get("state")
    if status:
        return str(status)
    return "SUCCEEDED" if summary.get("model_uri") else "FAILED"


def _executor_output(task_dir: Path) -> dict[str, Any]:
    path = task_dir / "executor_output.json"
    return json.loads(path.read_text()) if path.exists() else {}


def summarize(run_dir: Path) -> dict[str, Any]:
    """Read a kfp.local run folder: each task's ``executor_output.json`` and artifacts."""
    out: dict[str, Any] = {"run_dir": str(run_dir)}
    ev = _executor_output(run_dir / "evaluate")
    params = ev.get("parameterValues", {})
    if "Output" in params:
        out["gate_passed"] = bool(params["Output"])
    for artifact in ev.get("artifacts", {}).get("report", {}).get("artifacts", []):
        out["gate_reason"] = artifact.get("metadata", {}).get("gate_reason", "")
    for artifact in ev.get("artifacts", {}).get("metrics", {}).get("artifacts", []):
        out["metrics"] = {
            k: v
            for k, v in artifact.get("metadata", {}).items()
            if k != "gate_passed" and isinstance(v, int | float)
        }
    report = run_dir / "evaluate" / "report"
    if report.exists():
        out["report"] = str(report)
    model = run_dir / "train" / "model"
    if (model / "model.json").exists():
        out["model_uri"] = str(model)
    tuned = _executor_output(run_dir / "tune").get("parameterValues", {})
    if tuned.get("best_hyperparams"):
        out["tuned_hyperparams"] = tuned["best_hyperparams"]
    reg = _executor_output(run_dir / "register").get("parameterValues", {})
    if reg:
        out["registered_version"] = reg.get("version")
        out["registered_model_uri"] = reg.get("model_uri")
    return out
