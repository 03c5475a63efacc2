"""``gpupipe render pytorchjob|trainjob|experiment``: what the train or tune step would create, as
YAML, offline."""

from __future__ import annotations

from typing import Any, Literal

import yaml

from trainer.base.typedconfig import config_fields, from_dict, json_object
from trainer.launch.jobspec import JobSpec, job_name
from trainer.launch.pytorchjob import build_pytorchjob
from trainer.steps.train import TrainStepConfig, step_settings

Launcher = Literal["pytorchjob", "trainjob"]

DEFAULT_NAMESPACE = "kubeflow"
"""Where KFP standalone runs its pipelines (multi-user installs use the profile's namespace)."""
CONFIG_URI_PLACEHOLDER = (
    "minio://mlpipeline/v2/artifacts/<run-id>/train/model-work/worker-config.json"
)
"""Stands for the worker config the train step writes next to its model artifact."""


def train_step(
    params: dict[str, Any],
    *,
    namespace: str = DEFAULT_NAMESPACE,
    launcher: Launcher = "pytorchjob",
) -> TrainStepConfig:
    """The train step's settings for these pipeline parameters with a cluster ``launcher`` (the
    ``launcher`` parameter is ignored: this is what that launcher creates).

    The step's settings come from the train component's own mapping
    (:func:`trainer.steps.train.step_settings`: base parameters, then ``train_config_json``,
    then ``hyperparams_json``), so ``nnodes``, ``gpus_per_node`` and
    ``timeout_s`` overrides show up in the job.

    Args:
        params: training pipeline parameters by name; missing ones take the pipeline's defaults.
        namespace: namespace of the job.
        launcher: ``pytorchjob`` or ``trainjob``.

    Raises:
        InputError: an unknown parameter (the message lists the valid ones) or a bad value.
    """
    from pipelines.params import check_parameters, step_arguments

    p = check_parameters({"data_uri": "<data>", **params, "launcher": launcher})
    settings = step_settings(**step_arguments(p))
    settings["cluster"]["namespace"] = namespace
    return from_dict(TrainStepConfig, settings)


def train_job_spec(
    params: dict[str, Any],
    *,
    run_id: str = "render",
    namespace: str = DEFAULT_NAMESPACE,
    config_uri: str = CONFIG_URI_PLACEHOLDER,
    launcher: Launcher = "pytorchjob",
) -> JobSpec:
    """The job spec of the train step for these pipeline parameters (see :func:`train_step`).

    Raises:
        InputError: an unknown parameter (the message lists the valid ones) or a bad value.
    """
    step = train_step(params, namespace=namespace, launcher=launcher)
    run = step.training_run(job_name=job_name(run_id, "train"), config_uri=config_uri)
    return JobSpec(namespace=namespace, run=run, cluster=step.cluster)


def render_pytorchjob(
    params: dict[str, Any],
    *,
    namespace: str = DEFAULT_NAMESPACE,
    config_uri: str = CONFIG_URI_PLACEHOLDER,
) -> str:
    """YAML of the PyTorchJob the train step would create for these pipeline parameters.

    The job is complete and valid (``kubectl apply -f -`` accepts it); its name comes from a
    placeholder run id and its config URI is a placeholder, since both exist only in a real run.

    Args:
        params: training pipeline parameters by name (``nodes``, ``gpus_per_node``,
            ``gpu_type``, ``gpu_node_selector``, ``object_store_secret``, ...).
        namespace: namespace of the job.
        config_uri: URI of the worker config.

    Returns:
        The PyTorchJob as a YAML document.

    Raises:
        InputError: an unknown parameter (the message lists the valid ones) or a bad value.
    """
    spec = train_job_spec(params, namespace=namespace, config_uri=config_uri)
    return yaml.safe_dump(build_pytorchjob(spec), sort_keys=False)


def render_trainjob(
    params: dict[str, Any],
    *,
    namespace: str = DEFAULT_NAMESPACE,
    config_uri: str = CONFIG_URI_PLACEHOLDER,
) -> str:
    """YAML of the TrainJob the train step would create with ``launcher=trainjob``.

    The same job spec as :func:`render_pytorchjob` (one mapping), as a Kubeflow Trainer v2
    TrainJob on the runtime the ``trainer_runtime`` parameter names.

    Raises:
        InputError: an unknown parameter (the message lists the valid ones) or a bad value.
    """
    from trainer.launch.trainjob import build_trainjob

    spec = train_job_spec(params, namespace=namespace, config_uri=config_uri, launcher="trainjob")
    return yaml.safe_dump(build_trainjob(spec), sort_keys=False)


TRIAL_URI_PLACEHOLDER = "minio://mlpipeline/v2/artifacts/<run-id>/tune/trials"
"""Stands for the tune step's working folder, under which each trial gets its own folders."""


def render_experiment(
    params: dict[str, Any],
    *,
    space: dict[str, Any] | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    config_uri: str = CONFIG_URI_PLACEHOLDER,
) -> str:
    """YAML of the Katib Experiment the tune step would create for these pipeline parameters.

    Each trial is the PyTorchJob of :func:`render_pytorchjob` for the same parameters, with the
    searched fields passed as ``--set`` overrides.

    Args:
        params: training pipeline parameters by name (as for :func:`render_pytorchjob`).
        space: the search space in Katib's terms; ``None``: the ``tune_space_json`` parameter,
            or the example space for the MLP when that is empty (``{}``).
        namespace: namespace of the Experiment.
        config_uri: URI of the worker config the trials start from.

    Raises:
        InputError: an unknown parameter, a bad value or an invalid search space.
    """
    from trainer.config import WorkerConfig
    from trainer.tune.katib import build_experiment, experiment_name
    from trainer.tune.space import example_space, load_space

    spec = train_job_spec(params, namespace=namespace, config_uri=config_uri)
    if space is None:
        space = json_object(params.get("tune_space_json"), "tune_space_json") or example_space()
    searched = load_space(space, config_fields=config_fields(WorkerConfig))
    experiment = build_experiment(
        searched,
        name=experiment_name("render", "tune"),
        namespace=namespace,
        trial_job=build_pytorchjob(spec),
        base_overrides={},
        trial_uri=TRIAL_URI_PLACEHOLDER,
    )
    return yaml.safe_dump(experiment, sort_keys=False)
