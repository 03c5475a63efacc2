"""The train component: launches the training job (local torchrun or a PyTorchJob) and waits."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components.images import CUDA_IMAGE


@dsl.component(base_image=CUDA_IMAGE, install_kfp_package=False)
def train(
    dataset: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    model_name: str = "mlp",
    epochs: int = 10,
    learning_rate: float = 0.001,
    batch_size: int = 256,
    nproc_per_node: int = 1,
    nnodes: int = 1,
    launcher: str = "local",
    hyperparams_json: str = "{}",
    config_json: str = "{}",
    pipeline_run_id: str = "",
    task_name: str = "train",
    gpu_type: str = "nvidia.com/gpu",
):
    """Train on the preprocessed dataset (see trainer.steps.train).

    ``hyperparams_json`` takes dotted overrides (``{"optim.lr": 0.01}``), e.g. tune's best
    parameters; ``config_json`` any further TrainStepConfig fields. The job is named from the
    KFP run id and task name, and resumes from its checkpoints when the step is retried.
    ``gpu_type`` is the accelerator the pipeline asked for; it is recorded in the model's
    metadata (and, being an input, it reaches the step's sub-DAG on every backend).
    """
    import json

    from trainer.config import apply_overrides, from_dict
    from trainer.launchers.jobspec import job_name
    from trainer.steps import run_guarded, write_metadata_file
    from trainer.steps.train import TrainStepConfig, train_step

    def body():
        base = {
            "launcher": launcher,
            # 0 GPUs per node (a CPU cluster, kind) still means one (gloo) process per node.
            "nproc_per_node": max(nproc_per_node, 1),
            "nnodes": nnodes,
            "model": {"name": model_name},
            "optim": {"lr": learning_rate},
            "train": {"epochs": epochs, "global_batch_size": batch_size},
        }
        merged = apply_overrides(
            apply_overrides(base, json.loads(config_json)), json.loads(hyperparams_json)
        )
        cfg = from_dict(TrainStepConfig, merged)
        return train_step(
            cfg,
            dataset_uri=dataset.path,
            model_uri=model.path,
            work_uri=model.path + "-work",
            job_name=job_name(pipeline_run_id or "local", task_name),
        )

    result = run_guarded("train", body)
    for key, value in sorted(result.metrics.items()):
        metrics.log_metric(key, value)
    metrics.log_metric("steps", result.steps)
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
