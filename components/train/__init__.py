"""The train component: launches the training job (local torchrun, a PyTorchJob or a TrainJob)
and waits."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components.images import CUDA_IMAGE


@dsl.component(base_image=CUDA_IMAGE, install_kfp_package=False)
def train(
    dataset: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    model_name: str = "mlp",
    epochs: int = 0,
    learning_rate: float = 0.003,
    batch_size: int = 0,
    seed: int = 0,
    gpus_per_node: int = 1,
    nnodes: int = 1,
    launcher: str = "local",
    hyperparams_json: str = "{}",
    tuned_hyperparams_json: str = "{}",
    config_json: str = "{}",
    pipeline_run_id: str = "",
    task_name: str = "train",
    gpu_type: str = "nvidia.com/gpu",
    gpu_node_selector: dict = {},  # noqa: B006 - compiled into the YAML, never mutated
    object_store_secret: str = "",
    cuda_image: str = "",
    cpu_image: str = "",
    trainer_runtime: str = "torch-distributed",
    image_pull_secrets: list = [],  # noqa: B006 - compiled into the YAML, never mutated
    job_labels: dict = {},  # noqa: B006
    job_annotations: dict = {},  # noqa: B006
    job_env: dict = {},  # noqa: B006
    gang_queue: str = "",
    gang_priority_class: str = "",
    one_worker_per_node: bool = False,
    gpu_hour_usd: float = 0.0,
    gpu_prices: dict = {},  # noqa: B006 - compiled into the YAML, never mutated
    gpu_limit: str = "",
):
    """Train on the preprocessed dataset (see trainer.steps.train).

    ``hyperparams_json`` takes dotted overrides (``{"optim.lr": 0.01}``), e.g. tune's best
    parameters; ``tuned_hyperparams_json`` the tune step's best parameters (applied last);
    ``config_json`` any further TrainStepConfig fields (applied first); ``seed`` seeds
    initialisation, shuffling and dropout. The settings come from
    ``trainer.steps.train.step_settings``, the one parameter mapping (tune uses it too). The
    job is named from the KFP run id and task name, and resumes from its checkpoints when the
    step is retried.
    ``gpu_type`` is the accelerator the pipeline asked for; it is recorded in the model's
    metadata (and, being an input, it reaches the step's sub-DAG on every backend).
    ``gpu_limit`` is the GPU limit the pipeline sets on this pod, as text (tune's
    ``train_gpu_limit``): an input for the same reason, read by KFP's driver, not by the step.
    ``gpu_hour_usd`` or ``gpu_prices`` (per ``gpu_type``) price a GPU-hour: the estimate before
    launch and the actual cost go into the metrics and the model's metadata.

    With ``launcher="pytorchjob"`` or ``"trainjob"`` this pod only launches and watches (a
    TrainJob runs on the training runtime ``trainer_runtime``): the job's pods (GPU
    limits, node selector, object-store secret, pull secrets, labels, annotations, environment
    and gang scheduling from here) cannot see this pod's files, so they get URIs, and rank 0
    writes the model straight into KFP's artifact store. The job runs ``cuda_image`` (GPUs) or
    ``cpu_image``; the pipeline passes this package version's images (KFP re-runs this
    function's source, so defaults here can only be literals; they equal the pipeline's, which
    a test checks).

    The store: with ``launcher="local"`` the step reads and writes only the files KFP's launcher
    moves. With a cluster launcher this pod reads the store itself (it copies the job's model
    back) and the job's pods read and write it: give this step the store's credentials
    (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, e.g. from KFP's
    ``mlpipeline-minio-artifact`` secret through ``kfp.kubernetes.use_secret_as_env``) and the
    job the secret's name, ``object_store_secret``.
    """
    from trainer import storage
    from trainer.config import from_dict
    from trainer.entry import run_guarded, write_metadata_file
    from trainer.launch.jobspec import job_name, run_id
    from trainer.steps.train import TrainStepConfig, cost_metrics, step_settings, train_step

    def body():
        settings = step_settings(
            launcher=launcher,
            model_name=model_name,
            epochs=epochs,
            learning_rate=learning_rate,
            batch_size=batch_size,
            seed=seed,
            gpus_per_node=gpus_per_node,
            nodes=nnodes,
            gpu_type=gpu_type,
            gpu_node_selector=gpu_node_selector,
            object_store_secret=object_store_secret,
            cuda_image=cuda_image,
            cpu_image=cpu_image,
            trainer_runtime=trainer_runtime,
            image_pull_secrets=image_pull_secrets,
            job_labels=job_labels,
            job_annotations=job_annotations,
            job_env=job_env,
            gang_queue=gang_queue,
            gang_priority_class=gang_priority_class,
            one_worker_per_node=one_worker_per_node,
            gpu_hour_usd=gpu_hour_usd,
            gpu_prices=gpu_prices,
            train_config_json=config_json,
            hyperparams_json=hyperparams_json,
            tuned_hyperparams_json=tuned_hyperparams_json,
        )
        cfg = from_dict(TrainStepConfig, settings)
        remote = cfg.launcher != "local"
        model_uri = model.uri if remote else model.path
        result = train_step(
            cfg,
            dataset_uri=dataset.uri if remote else dataset.path,
            model_uri=model_uri,
            work_uri=model_uri.rstrip("/") + "-work",
            job_name=job_name(run_id(pipeline_run_id), task_name),
        )
        if remote and model.uri != model.path:
            # KFP uploads model.path when the step ends: give it the files the job wrote.
            storage.copy_tree(model.uri, model.path)
        return result

    result = run_guarded("train", body)
    for key, value in sorted(result.metrics.items()):
        metrics.log_metric(key, value)
    metrics.log_metric("steps", result.steps)
    for key, value in cost_metrics(result.cost).items():
        metrics.log_metric(key, value)
    model.metadata.update(cost_metrics(result.cost))
    model.metadata.update(
        {
            "accelerator": gpu_type,
            "framework": "pytorch",
            "format": "safetensors",
            "model": model_name,
            "job": result.job_name,
        }
    )
    write_metadata_file(metrics.path, dict(metrics.metadata))
