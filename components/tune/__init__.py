"""The tune component: a hyperparameter search (local Optuna study or Katib Experiment)."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Metrics, Output

from components.images import CUDA_IMAGE


@dsl.component(base_image=CUDA_IMAGE, install_kfp_package=False)
def tune(
    dataset: Input[Dataset],
    best_params: Output[Artifact],
    metrics: Output[Metrics],
    report: Output[HTML],
    enabled: bool = True,
    space_json: str = "{}",
    engine: str = "local",
    model_name: str = "mlp",
    trial_epochs: int = 0,
    learning_rate: float = 0.003,
    batch_size: int = 0,
    gpus_per_node: int = 1,
    seed: int = 0,
    hyperparams_json: str = "{}",
    train_config_json: str = "{}",
    config_json: str = "{}",
    work_uri: str = "",
    pipeline_run_id: str = "",
    task_name: str = "tune",
    gpu_type: str = "nvidia.com/gpu",
    gpu_node_selector: dict = {},  # noqa: B006 - compiled into the YAML, never mutated
    object_store_secret: str = "",
    cuda_image: str = "",
    cpu_image: str = "",
    image_pull_secrets: list = [],  # noqa: B006 - compiled into the YAML, never mutated
    job_labels: dict = {},  # noqa: B006
    job_annotations: dict = {},  # noqa: B006
    job_env: dict = {},  # noqa: B006
    gang_queue: str = "",
    gang_priority_class: str = "",
    one_worker_per_node: bool = False,
    gpu_hour_usd: float = 0.0,
    gpu_prices: dict = {},  # noqa: B006 - compiled into the YAML, never mutated
) -> NamedTuple(
    "Outputs",
    [("best_hyperparams", dict), ("best_hyperparams_json", str), ("train_gpu_limit", str)],
):
    """Search hyperparameters over the preprocessed dataset (see trainer.steps.tune).

    ``enabled=False`` skips the search and outputs no parameters (``{}``), so a pipeline can
    always wire tune's output into train (kfp.local cannot join conditional branches).

    ``space_json`` is the search space in Katib's vocabulary (``{}``: the default space over
    learning rate, width, weight decay and dropout, TPE with median stopping, its ranges and
    trial count scaled with the training rows: ``trainer.tune.space.default_space``).
    Every trial starts from the train step's settings for the same pipeline parameters
    (``learning_rate``, ``seed``, ``hyperparams_json``, ``train_config_json``, ...; see
    ``trainer.steps.train.step_settings``), on one node, for ``trial_epochs`` epochs (0: the
    settings from the data, as the final training gets them); only the searched fields
    differ. ``config_json`` takes further dotted TuneConfig overrides
    (``{"train.optim.warmup_steps": 10}``). Outputs: the best parameters as a JSON artifact,
    as a dict and as a JSON string (the train step's ``hyperparams_json``), a Metrics artifact
    (best objective, trial counts) and an HTML report; and ``train_gpu_limit``, the train
    pod's GPU limit as text (``gpus_per_node``, empty for none): KFP 2.17's driver reads an
    accelerator count given by a channel only as a string, and drops an int pipeline
    parameter's.

    ``engine="local"`` runs the trials in this pod (torchrun per trial); its study journal and
    trial folders live in ``work_uri`` (default: next to the output artifact), so a retried
    step resumes the study. ``engine="katib"`` creates a Katib Experiment whose trials are the
    train step's PyTorchJob (``cuda_image`` or ``cpu_image``); ``work_uri`` must then be an
    object-store URI (default: next to the artifact's URI).

    The store: ``engine="local"`` reads only the files KFP's launcher brings in. With
    ``engine="katib"`` this step and its trials' pods read and write the store themselves: give
    this step the store's credentials (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, e.g.
    from KFP's ``mlpipeline-minio-artifact`` secret through ``kfp.kubernetes.use_secret_as_env``)
    and the trials the secret's name, ``object_store_secret``.
    """
    import json
    from collections import namedtuple

    from trainer.config import apply_overrides, from_dict
    from trainer.entry import run_guarded, write_metadata_file
    from trainer.launch import jobspec
    from trainer.steps.train import read_schema, step_settings
    from trainer.steps.tune import TuneConfig, tune_disabled
    from trainer.steps.tune import tune as run
    from trainer.tune.space import default_space

    def body():
        remote = engine == "katib"
        launcher = "pytorchjob" if remote else "local"
        # Trials run on one node, where the engine runs them (a PyTorchJob or a process here:
        # no TrainJob runtime), whatever the final training uses.
        train = step_settings(
            launcher=launcher,
            model_name=model_name,
            epochs=trial_epochs,
            learning_rate=learning_rate,
            batch_size=batch_size,
            seed=seed,
            gpus_per_node=gpus_per_node,
            nodes=1,
            gpu_type=gpu_type,
            gpu_node_selector=gpu_node_selector,
            object_store_secret=object_store_secret,
            trainer_runtime="",
            image_pull_secrets=image_pull_secrets,
            job_labels=job_labels,
            job_annotations=job_annotations,
            job_env=job_env,
            gang_queue=gang_queue,
            gang_priority_class=gang_priority_class,
            one_worker_per_node=one_worker_per_node,
            gpu_hour_usd=gpu_hour_usd,
            gpu_prices=gpu_prices,
            cuda_image=cuda_image,
            cpu_image=cpu_image,
            train_config_json=train_config_json,
            hyperparams_json=hyperparams_json,
        )
        train = apply_overrides(train, {"launcher": launcher, "nnodes": 1})
        base = {"engine": engine, "trial_epochs": trial_epochs or None, "seed": seed,
                "train": train}  # fmt: skip
        # No space given: the default one, scaled with the table like the trials' settings.
        rows = (read_schema(dataset.path).get("splits") or {}).get("train")
        base["space"] = json.loads(space_json) or default_space(rows)
        cfg = from_dict(TuneConfig, apply_overrides(base, json.loads(config_json)))
        out_uri = best_params.uri if remote else best_params.path
        return run(
            cfg,
            dataset_uri=dataset.uri if remote else dataset.path,
            work_uri=work_uri or out_uri.rstrip("/") + "-work",
            output_uri=best_params.path,
            report_uri=report.path,
            run_id=jobspec.run_id(pipeline_run_id),
            task_name=task_name,
        )

    outputs = namedtuple(
        "Outputs", ["best_hyperparams", "best_hyperparams_json", "train_gpu_limit"]
    )
    gpu_limit = str(gpus_per_node) if gpus_per_node > 0 else ""
    if not enabled:
        run_guarded(
            "tune", lambda: tune_disabled(output_uri=best_params.path, report_uri=report.path)
        )
        metrics.log_metric("enabled", 0.0)
        write_metadata_file(metrics.path, dict(metrics.metadata))
        return outputs({}, "{}", gpu_limit)

    result = run_guarded("tune", body)
    for key, value in sorted(result.metrics().items()):
        metrics.log_metric(key, value)
    best_params.metadata.update(
        {
            "objective": result.objective_metric,
            "direction": result.direction,
            "best_value": result.best_value,
            "engine": result.engine,
            "study": result.study,
        }
    )
    report.metadata.update({"stopped_reason": result.stopped_reason})
    write_metadata_file(metrics.path, dict(metrics.metadata))
    best = dict(result.best_params)
    return outputs(best, json.dumps(best, sort_keys=True), gpu_limit)
