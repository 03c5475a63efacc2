"""The summary of a finished KFP run, as ``gpupipe run --local`` prints one, from the cluster.

KFP's REST API says how each task ended but not what it produced (artifact contents and output
parameters live in ML Metadata and the artifact store). What the steps wrote is in the store under
the run's own folder, ``<pipeline root>/<pipeline name>/<run id>/<task>/<salt>/<output>``, as
KFP 2.17's driver names output URIs: the evaluate step's metrics file (its metrics, the gate and
the gate's reason) and baselines file, the trained model (``model.json``, ``cost.json``) and the
report. They are read with the trainer's own storage layer, so ``minio://`` needs
``MINIO_ENDPOINT`` and the store's keys (``MINIO_ACCESS_KEY``/``MINIO_SECRET_KEY``) where the
run's pipeline root is KFP's default store; without them the summary says so and names what to
set.

The pipeline root and the run id come from the server: they are used only when they have the
shape KFP gives them (a remote store's URI, a UUID), so no answer can make this read a local
path; and what the files say reaches the terminal through the filter of our own error lines.
"""

from __future__ import annotations

import re
from typing import Any

import kfp_server_api as kapi

DEFAULT_PIPELINE_ROOT = "minio://mlpipeline/v2/artifacts"
"""KFP's default pipeline root when neither the run nor the ``kfp-launcher`` config sets one."""
REMOTE_ROOTS = ("minio://", "s3://", "gs://")
"""The pipeline roots a server's answer may name: object stores, never a path on this machine."""


def _task_state(run: kapi.V2beta1Run, name: str) -> str | None:
    tasks = (run.run_details.task_details if run.run_details else None) or []
    states = [str(t.state) for t in tasks if t.display_name == name]
    return states[0] if states else None


def outputs_of(run_root: str) -> dict[str, dict[str, str]]:
    """task name -> output name -> URI, for every output the run's tasks wrote."""
    from trainer.base import storage

    found: dict[str, dict[str, str]] = {}
    for task in storage.list_dir(run_root):
        task_dir = storage.join(run_root, task)
        if not storage.is_dir(task_dir):
            continue
        for salt in storage.list_dir(task_dir):
            salt_dir = storage.join(task_dir, salt)
            if storage.is_dir(salt_dir):
                for out in storage.list_dir(salt_dir):
                    found.setdefault(task, {})[out] = storage.join(salt_dir, out)
    return found


def failed_step_line(outputs: dict[str, dict[str, str]]) -> str | None:
    """The failed step's own ``ERROR [<step>] E_...`` line, from the step logs KFP archives
    (``executor-logs-<n>`` beside a task's outputs): KFP's API carries no task error."""
    from trainer.base import storage

    found: str | None = None
    for outs in outputs.values():
        for name, uri in sorted(outs.items()):
            if not name.startswith("executor-logs"):
                continue
            for line in storage.read_text(uri).splitlines():
                if line.startswith("ERROR [") and " E_" in line:
                    found = line.strip()
    if found is None:
        return None
    from pipelines.cluster import server_text

    return server_text(found, 1000)


def run_summary(
    run: kapi.V2beta1Run, *, pipeline_name: str, link: str, pipeline_root: str | None = None
) -> dict[str, Any]:
    """The summary of a finished run: its state, and what its steps wrote where readable.

    Args:
        run: the run as KFP answered it.
        pipeline_name: the pipeline's name, the first folder under the pipeline root.
        link: the run's page in the KFP UI.
        pipeline_root: where the run's outputs are when the run names no pipeline root (the
            caller's own setting, not the server's; default :data:`DEFAULT_PIPELINE_ROOT`).
    """
    from pipelines.cluster import failed_tasks, is_uuid, server_text
    from trainer.base import storage

    params = dict((run.runtime_config.parameters if run.runtime_config else None) or {})
    told = run.runtime_config.pipeline_root if run.runtime_config else None
    root = told or pipeline_root or DEFAULT_PIPELINE_ROOT
    run_id = str(run.run_id)
    run_root = storage.join(root, pipeline_name, run_id)
    summary: dict[str, Any] = {
        "run_dir": link,
        "run_id": server_text(run_id, 80),
        "state": server_text(run.state, 40),
        "registry_uri": server_text(params.get("registry_uri") or "(the embedded local registry)"),
        "registered_model_name": server_text(params.get("registered_model_name", "gpupipe-model")),
        "artifacts": server_text(run_root),
    }
    if str(run.state) != "SUCCEEDED":
        failed = failed_tasks(run)
        summary["failed_step"] = failed[0].split(":", 1)[0] if failed else "(none reported)"
    odd = []
    if told and not str(told).startswith(REMOTE_ROOTS):
        odd.append(f"a pipeline root of {server_text(told, 100)!r}, not an object store's URI")
    if not is_uuid(run_id):
        odd.append(f"a run id of {server_text(run_id, 80)!r}, not a UUID")
    if odd:
        summary["artifacts_error"] = f"not read: KFP answered {' and '.join(odd)}"
        return summary
    try:
        outputs = outputs_of(run_root)
    except (OSError, ValueError, RuntimeError) as e:  # storage names the URI in all three
        summary["artifacts_error"] = (
            f"cannot read {run_root}: {' '.join(str(e).split())[:200]} (set MINIO_ENDPOINT, "
            "MINIO_ACCESS_KEY and MINIO_SECRET_KEY for KFP's store, e.g. through a "
            "port-forward of svc/seaweedfs 9000)"
        )
        return summary
    evaluate = outputs.get("evaluate", {})
    if "metrics" in evaluate:
        values = storage.read_json(evaluate["metrics"])
        summary["gate_passed"] = bool(values.get("gate_passed"))
        summary["gate_reason"] = str(values.get("gate_reason", ""))
        summary["metrics"] = {
            k: v
            for k, v in values.items()
            if k != "gate_passed" and isinstance(v, int | float) and not isinstance(v, bool)
        }
    if "baselines" in evaluate:  # listed with the model's, as baseline_<baseline>_<metric>
        values = storage.read_json(evaluate["baselines"])
        summary.setdefault("metrics", {}).update(
            {
                f"baseline_{k}": v
                for k, v in values.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            }
        )
    if "report" in evaluate:
        summary["report"] = evaluate["report"]
    for task, outs in sorted(outputs.items()):
        model = outs.get("model")
        if task.startswith("train") and model and storage.exists(storage.join(model, "model.json")):
            summary["model_uri"] = model
            cost = storage.join(model, "cost.json")
            if storage.exists(cost):
                summary["cost"] = storage.read_json(cost)
    if str(run.state) != "SUCCEEDED" and (line := failed_step_line(outputs)):
        summary["error"] = line
        if step := re.match(r"ERROR \[([^\]]+)\]", line):
            summary["failed_step"] = step.group(1)  # KFP names the leaf task "executor"
    register = _task_state(run, "register")
    if register == "SUCCEEDED":
        summary["registered_version"] = f"tagged with KFP run {run.run_id}"
    return summary
