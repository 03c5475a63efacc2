"""A search space as a Katib ``kubeflow.org/v1beta1`` Experiment resource (a validated dict).

- **Names.** Katib parameter and trial-parameter names are DNS-like, so a dotted config field maps
  to a lowercase, dash-separated name (``optim.lr`` -> ``optim-lr``, ``model.hidden_dim`` ->
  ``model-hidden-dim``, see :func:`katib_name`). Two fields that map to one name are an error. The
  mapping travels with the Experiment as the annotation :data:`PARAMETERS_ANNOTATION`, and the
  launcher maps the best trial's values back to dotted names.
- **Trials.** The trial template is the train launcher's own PyTorchJob (same image, /dev/shm,
  GPU limits, Istio annotation, security context) with Katib's required changes: no
  ``metadata.name``/``namespace`` (Katib names each trial's job), and every replica's command
  extended by ``--set <field>=${trialParameters.<name>}`` per parameter, the step's own
  overrides, and ``--set train.metrics_stdout=true`` so that the worker prints ``name=value``
  lines for Katib's StdOut collector. A trial parameter ``trial-name`` (``${trialSpec.Name}``)
  names each trial's job in logs and labels and, when ``trial_uri`` is given, gives each trial
  its own checkpoint and output folders (trials must never resume from each other).
- **Conditions.** A trial succeeds on the PyTorchJob condition ``Succeeded`` and fails on
  ``Failed`` (the Training Operator's condition types); the metrics collector is injected into
  the master pod only (``training.kubeflow.org/job-role: master``), the rank that prints metrics.
- **retain: false.** Katib deletes each finished trial's PyTorchJob (its pods and their logs go
  too) so that a long search does not pile up finished jobs; the Trial objects, with their
  parameters and metrics, stay until the Experiment is deleted.

Katib's Experiment CRD has no schema, so :func:`trial_template_errors` checks what its
validating webhook would.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from trainer.base.errors import InputError
from trainer.base.typedconfig import parse_value
from trainer.tune.space import SearchSpace

API_VERSION = "kubeflow.org/v1beta1"
KIND = "Experiment"
PRIMARY_CONTAINER = "pytorch"
MASTER_POD_LABELS = {"training.kubeflow.org/job-role": "master"}
"""The Training Operator's label of the master pod: the one pod whose stdout carries metrics."""
SUCCESS_CONDITION = 'status.conditions.#(type=="Succeeded")#|#(status=="True")#'
FAILURE_CONDITION = 'status.conditions.#(type=="Failed")#|#(status=="True")#'
TRIAL_NAME_PARAM = "trial-name"
"""Trial parameter that Katib fills with the trial's (and its PyTorchJob's) name."""
PARAMETERS_ANNOTATION = "gpupipe.dev/parameters"
"""JSON ``{katib name: dotted config field}`` on the Experiment."""
MAX_EXPERIMENT_NAME_LEN = 39
"""Trial jobs are ``<experiment>-<8 chars>`` and their pods ``<job>-worker-<i>`` (63 at most);
Katib's suggestion service ``<experiment>-<algorithm>`` must fit too."""
_PLACEHOLDER = re.compile(r"\$\{trialParameters\.[^}]*\}")
_META_REFERENCE = re.compile(
    r"^\$\{trialSpec\.(Name|Namespace|Kind|APIVersion|(Labels|Annotations)\[[^\]]+\])\}$"
)
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


# --------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------


def katib_name(dotted: str) -> str:
    """The Katib parameter name of a dotted config field: ``model.hidden_dim`` ->
    ``model-hidden-dim``."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", dotted.lower())).strip("-")


def parameter_names(space: SearchSpace) -> dict[str, str]:
    """``{dotted field: Katib name}`` for every parameter of ``space``.

    Raises:
        InputError: two fields map to the same Katib name, or one maps to the reserved
            ``trial-name``.
    """
    out: dict[str, str] = {}
    seen: dict[str, str] = {TRIAL_NAME_PARAM: "(reserved)"}
    for i, p in enumerate(space.parameters):
        name = katib_name(p.name)
        if name in seen or not _NAME.match(name):
            raise InputError(
                "E_CONFIG",
                f"tune.parameters[{i}].name maps to Katib name {name!r}, which is invalid or "
                f"taken by {seen.get(name)!r}, got {p.name!r}",
                f"tune.parameters[{i}].name",
            )
        seen[name] = p.name
        out[p.name] = name
    return out


def experiment_name(run_id: str, task_name: str, prefix: str = "gpupipe") -> str:
    """The Experiment name of one task of one run: same inputs, same name (safe to retry).

    ``<prefix>-<task>-<run id start>-<10 hex digits of sha256(run id, task)>``, at most
    :data:`MAX_EXPERIMENT_NAME_LEN` characters.

    Raises:
        InputError: ``run_id`` or ``task_name`` is empty.
    """
    for what, value in (("run_id", run_id), ("task_name", task_name)):
        if not value:
            raise InputError("E_CONFIG", f"{what} must not be empty, got {value!r}", what)
    digest = hashlib.sha256(f"{run_id}\x00{task_name}".encode()).hexdigest()[:10]
    readable = "-".join(
        p for p in (katib_name(prefix), katib_name(task_name), katib_name(run_id)[:6]) if p
    )
    if not readable[:1].isalpha():
        readable = f"e-{readable}".rstrip("-")
    readable = readable[: MAX_EXPERIMENT_NAME_LEN - len(digest) - 1].rstrip("-")
    return f"{readable}-{digest}"


# --------------------------------------------------------------------------------------------
# The Experiment
# --------------------------------------------------------------------------------------------


def _override_text(value: Any) -> str:
    """``value`` as the worker's ``--set`` parses it back (JSON, else the plain string)."""
    if isinstance(value, str) and parse_value(value) == value:
        return value
    return json.dumps(value)


def _trial_spec(trial_job: dict[str, Any], args: list[str], trial_name_ref: str) -> dict[str, Any]:
    """The PyTorchJob as a trial template: no name or namespace or owners, args appended."""
    job = copy.deepcopy(trial_job)
    if job.get("apiVersion") != "kubeflow.org/v1" or job.get("kind") != "PyTorchJob":
        raise InputError(
            "E_CONFIG",
            f"trial_job must be a kubeflow.org/v1 PyTorchJob, got {job.get('apiVersion')!r} "
            f"{job.get('kind')!r}",
            "trial_job",
        )
    meta = job.get("metadata") or {}
    for key in ("name", "namespace", "ownerReferences", "uid", "resourceVersion"):
        meta.pop(key, None)
    job["metadata"] = meta
    for labels in [meta.get("labels") or {}]:
        if "gpupipe.dev/job" in labels:
            labels["gpupipe.dev/job"] = trial_name_ref
    replicas = (job.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    if "Master" not in replicas:
        raise InputError("E_CONFIG", "trial_job has no Master replica", "trial_job")
    for rtype, rspec in replicas.items():
        template = rspec.get("template") or {}
        tlabels = (template.get("metadata") or {}).get("labels") or {}
        if "gpupipe.dev/job" in tlabels:
            tlabels["gpupipe.dev/job"] = trial_name_ref
        containers = (template.get("spec") or {}).get("containers") or []
        main = [c for c in containers if c.get("name") == PRIMARY_CONTAINER]
        if not main or not main[0].get("command"):
            raise InputError(
                "E_CONFIG",
                f"trial_job {rtype} has no container {PRIMARY_CONTAINER!r} with a command",
                "trial_job",
            )
        # The StdOut collector wraps the container's command: extend it, not args.
        main[0]["command"] = [*main[0]["command"], *args]
        for env in main[0].get("env") or []:
            if env.get("name") == "GPUPIPE_JOB":
                env["value"] = trial_name_ref
    return job


def build_experiment(
    space: SearchSpace,
    *,
    name: str,
    namespace: str,
    trial_job: dict[str, Any],
    base_overrides: dict[str, Any],
    trial_uri: str | None = None,
    retain_trials: bool = False,
) -> dict[str, Any]:
    """The Katib Experiment that searches ``space`` with trials running ``trial_job``.

    Args:
        space: a validated search space (dotted parameter names).
        name: the Experiment's name (see :func:`experiment_name`).
        namespace: where the Experiment and its trials run.
        trial_job: the PyTorchJob of one trial, from
            :func:`trainer.launch.pytorchjob.build_pytorchjob` (its name and namespace are
            dropped: Katib names trial jobs).
        base_overrides: dotted config overrides every trial gets (``{"train.epochs": 5}``);
            searched fields may not appear here.
        trial_uri: folder under which each trial gets ``<trial name>/checkpoints`` and
            ``<trial name>/model`` (checkpoint, model and history locations of the worker);
            ``None`` keeps the worker config's own (then trials must not checkpoint).
        retain_trials: keep each finished trial's PyTorchJob (and pods) for debugging.

    Returns:
        The Experiment as a dict, checked against the rules of Katib's validating webhook.

    Raises:
        InputError: a bad name, a clash between overrides and searched fields, or a trial
            template that Katib's webhook would reject.
    """
    if not (_NAME.match(name) and len(name) <= MAX_EXPERIMENT_NAME_LEN):
        raise InputError(
            "E_CONFIG",
            f"experiment name must be a DNS-1035 label of at most {MAX_EXPERIMENT_NAME_LEN} "
            f"characters, got {name!r}",
            "tune.name",
        )
    names = parameter_names(space)
    trial_ref = f"${{trialParameters.{TRIAL_NAME_PARAM}}}"
    args = _trial_args(names, base_overrides, trial_uri, trial_ref)
    spec = _search_spec(space, names)
    spec["trialTemplate"] = {
        "primaryContainerName": PRIMARY_CONTAINER,
        "primaryPodLabels": dict(MASTER_POD_LABELS),
        "successCondition": SUCCESS_CONDITION,
        "failureCondition": FAILURE_CONDITION,
        "retain": retain_trials,
        "trialParameters": _trial_parameters(names),
        "trialSpec": _trial_spec(trial_job, args, trial_ref),
    }
    experiment = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "gpupipe"},
            "annotations": {
                PARAMETERS_ANNOTATION: json.dumps({k: d for d, k in names.items()}, sort_keys=True)
            },
        },
        "spec": spec,
    }
    errors = trial_template_errors(experiment)
    if errors:
        raise InputError("E_CONFIG", f"Katib would reject the trial template: {errors[0]}", name)
    return experiment


def _trial_args(
    names: dict[str, str],
    base_overrides: dict[str, Any],
    trial_uri: str | None,
    trial_ref: str,
) -> list[str]:
    """The ``--set`` arguments every trial's worker gets: fixed overrides, then searched fields."""
    clash = sorted(set(base_overrides) & set(names))
    if clash:
        raise InputError(
            "E_CONFIG",
            f"base override {clash[0]} is also a searched parameter, "
            f"got {base_overrides[clash[0]]!r}",
            clash[0],
        )
    overrides: dict[str, Any] = dict(base_overrides)
    if trial_uri is not None:
        root = f"{trial_uri.rstrip('/')}/{trial_ref}"
        overrides |= {
            "checkpoint.uri": f"{root}/checkpoints",
            "output.model_uri": f"{root}/model",
            "output.history_uri": f"{root}/history.jsonl",
        }
    overrides["train.metrics_stdout"] = True
    args: list[str] = []
    for key, value in overrides.items():
        args += ["--set", f"{key}={_override_text(value)}"]
    for dotted, kname in names.items():
        args += ["--set", f"{dotted}=${{trialParameters.{kname}}}"]
    return args


def _trial_parameters(names: dict[str, str]) -> list[dict[str, str]]:
    """One trial parameter per searched field, and the trial's own name."""
    out = [
        {"name": kname, "reference": kname, "description": f"trainer config field {dotted}"}
        for dotted, kname in names.items()
    ]
    out.append(
        {
            "name": TRIAL_NAME_PARAM,
            "reference": "${trialSpec.Name}",
            "description": "the trial's name (names its job, logs and folders)",
        }
    )
    return out


def _search_spec(space: SearchSpace, names: dict[str, str]) -> dict[str, Any]:
    """The Experiment spec's search part: objective, algorithm, parameters, counts, stopping."""

    def settings(items: list[Any], mapped: tuple[str, ...] = ()) -> list[dict[str, str]]:
        return [
            {"name": s.name, "value": names.get(s.value, s.value) if s.name in mapped else s.value}
            for s in items
        ]

    parameters = []
    for p in space.parameters:
        fs = {
            k: v
            for k, v in (
                ("min", p.feasibleSpace.min),
                ("max", p.feasibleSpace.max),
                ("step", p.feasibleSpace.step),
                ("list", p.feasibleSpace.list),
                ("distribution", p.feasibleSpace.distribution),
            )
            if v is not None
        }
        parameters.append(
            {"name": names[p.name], "parameterType": p.parameterType, "feasibleSpace": fs}
        )
    objective: dict[str, Any] = {
        "type": space.objective.type,
        "objectiveMetricName": space.objective.objectiveMetricName,
    }
    if space.objective.goal is not None:
        objective["goal"] = space.objective.goal
    if space.objective.additionalMetricNames:
        objective["additionalMetricNames"] = list(space.objective.additionalMetricNames)
    spec: dict[str, Any] = {
        "objective": objective,
        "algorithm": {
            "algorithmName": space.algorithm.algorithmName,
            "algorithmSettings": settings(space.algorithm.algorithmSettings, ("resource_name",)),
        },
        "parameters": parameters,
        "maxTrialCount": space.maxTrialCount,
        "parallelTrialCount": space.parallelTrialCount,
        "maxFailedTrialCount": space.maxFailedTrialCount,
        "metricsCollectorSpec": {"collector": {"kind": "StdOut"}},
    }
    if space.earlyStopping is not None:
        spec["earlyStopping"] = {
            "algorithmName": space.earlyStopping.algorithmName,
            "algorithmSettings": settings(space.earlyStopping.algorithmSettings),
        }
    return spec


def trial_template_errors(experiment: Mapping[str, Any]) -> list[str]:
    """What Katib's validating webhook would say about the Experiment's name and trial template.

    Katib's Experiment CRD has no schema: its webhook checks that trial parameters have a name
    and a reference, are not duplicated, reference an Experiment parameter or trial metadata
    (``${trialSpec.Name}``), are each used in the template, and that the template uses no
    undeclared ``${trialParameters.x}``, has apiVersion and kind and no name or namespace.
    """
    errors: list[str] = []
    name = str((experiment.get("metadata") or {}).get("name") or "")
    if not _NAME.match(name):
        errors.append(f"metadata.name {name!r} must match ^[a-z]([-a-z0-9]*[a-z0-9])?$")
    spec = experiment.get("spec") or {}
    tt = spec.get("trialTemplate") or {}
    for key in ("primaryContainerName", "successCondition", "failureCondition"):
        if not tt.get(key):
            errors.append(f"trialTemplate.{key} must be set")
    trial_spec = tt.get("trialSpec")
    if not isinstance(trial_spec, dict):
        return [*errors, "trialTemplate.trialSpec must be set"]
    text = json.dumps(trial_spec)
    param_names = {p.get("name") for p in spec.get("parameters") or []}
    seen_names: set[str] = set()
    seen_refs: set[str] = set()
    for i, tp in enumerate(tt.get("trialParameters") or []):
        tname, ref = tp.get("name") or "", tp.get("reference") or ""
        where = f"trialTemplate.trialParameters[{i}]"
        if not tname or not ref or "{" in tname or "}" in tname:
            errors.append(f"{where}: name and reference must be set, name without braces")
            continue
        if tname in seen_names or ref in seen_refs:
            errors.append(f"{where}: name {tname!r} or reference {ref!r} is duplicated")
            continue
        seen_names.add(tname)
        seen_refs.add(ref)
        if ref not in param_names and not _META_REFERENCE.match(ref):
            errors.append(f"{where}.reference {ref!r} is no parameter and no trial metadata")
        placeholder = f"${{trialParameters.{tname}}}"
        if placeholder not in text:
            errors.append(f"{where}.name {tname!r} is not used in the trial template")
        text = text.replace(placeholder, "test-value")
    left = sorted(set(_PLACEHOLDER.findall(text)))
    if left:
        errors.append(f"trial template uses undeclared trial parameters {left}")
    meta = trial_spec.get("metadata") or {}
    if meta.get("name") or meta.get("namespace"):
        errors.append("trialSpec metadata.name and metadata.namespace must be omitted")
    if not trial_spec.get("apiVersion") or not trial_spec.get("kind"):
        errors.append("trialSpec apiVersion and kind must be set")
    return errors
