"""The train step: turn a preprocessed dataset into a worker config and launch the training job.

The job itself is always ``torchrun ... -m trainer.worker --config <uri>``; a
:class:`trainer.launch.Launcher` decides where it runs. :class:`~trainer.launch.local.LocalLauncher`
runs it as a subprocess on this machine (what ``kfp.local`` and laptops use); the PyTorchJob
(:mod:`trainer.launch.pytorchjob`) and TrainJob (:mod:`trainer.launch.trainjob`) launchers run
it on a cluster behind the same protocol, from the same job spec.
Everything the job needs travels as URIs, never as local paths of the launcher.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from trainer.base import outputs, storage
from trainer.base.cost import resolve_price
from trainer.base.errors import InputError
from trainer.base.typedconfig import (
    apply_overrides,
    from_dict,
    json_object,
    require,
    to_dict,
    to_json,
)
from trainer.config import (
    EMBEDDING_DIM,
    EMBEDDING_FREQUENCIES,
    DistConfig,
    ModelConfig,
    OptimConfig,
    TrainConfig,
    WorkerConfig,
)
from trainer.launch import Launcher, TrainingRun, processes_per_node

# Re-exported: the pipeline's pod settings use them (the in-step train pod is a training pod).
from trainer.launch.jobspec import ClusterConfig
from trainer.launch.local import LocalLauncher
from trainer.steps.train.auto_settings import (
    AUTO_FIELDS,
    AUTO_SETTINGS_FILE,
    AutoSettings,
    AutoSettingsConfig,
    choose_settings,
)
from trainer.steps.train.cost import WatchConfig, estimate_before_launch
from trainer.steps.train.cost import record as record_cost

log = logging.getLogger(__name__)

CLUSTER_LAUNCHERS = ("pytorchjob", "trainjob")
"""Launchers that run the job as a custom resource on a cluster (the ``cluster`` section)."""


def _cuda_here() -> bool:
    """Whether torchrun in this step will find a GPU (``launcher=local``)."""
    import torch

    return bool(torch.cuda.is_available())


@dataclass(kw_only=True, slots=True)
class TrainStepConfig:
    """What the pipeline's train step asks for; data and output locations come from KFP."""

    launcher: Literal["local", "pytorchjob", "trainjob"] = "local"
    """``local``: torchrun subprocess here; ``pytorchjob``: a Training Operator PyTorchJob;
    ``trainjob``: a Kubeflow Trainer v2 TrainJob."""
    gpus_per_node: int = 0
    """GPUs per node, one training process each; 0: one process per node (gloo on CPU). The
    local launcher starts as many processes (on CPU where the machine has no GPU)."""
    nnodes: int = 1
    """Nodes (PyTorchJob replicas, TrainJob nodes); the local launcher supports 1."""
    timeout_s: int | None = None
    """Fail (and stop the job) if training has not finished after this many seconds."""
    checkpoint_every_steps: int = 100
    """Checkpoint period; a retried step resumes from the newest checkpoint."""
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    auto: AutoSettingsConfig = field(default_factory=AutoSettingsConfig)
    """Settings from the data: batch, epochs, warmup, early stopping and the target scale."""
    watch: WatchConfig = field(default_factory=WatchConfig)
    """The job's Prometheus endpoint, the price of a GPU-hour, the estimate's throughput."""

    def __post_init__(self) -> None:
        require(
            self.launcher in CLUSTER_LAUNCHERS or self.launcher == "local",
            "train.launcher",
            f"must be local or one of {', '.join(CLUSTER_LAUNCHERS)}",
            self.launcher,
        )
        if self.launcher in CLUSTER_LAUNCHERS:
            require(
                bool(self.cluster.image),
                "train.cluster.image",
                f"must be set for launcher {self.launcher!r}",
                self.cluster.image,
            )
        require(self.gpus_per_node >= 0, "train.gpus_per_node", "must be >= 0", self.gpus_per_node)
        require(self.nnodes > 0, "train.nnodes", "must be > 0", self.nnodes)
        require(
            self.timeout_s is None or self.timeout_s > 0,
            "train.timeout_s",
            "must be > 0 or null",
            self.timeout_s,
        )
        require(
            self.checkpoint_every_steps > 0,
            "train.checkpoint_every_steps",
            "must be > 0",
            self.checkpoint_every_steps,
        )

    def training_run(self, *, job_name: str, config_uri: str) -> TrainingRun:
        """The run every launcher gets: the one route of the step's nodes, GPUs and deadline."""
        return TrainingRun(
            job_name=job_name,
            config_uri=config_uri,
            gpus_per_node=self.gpus_per_node,
            nnodes=self.nnodes,
            timeout_s=self.timeout_s,
            metrics_port=self.watch.port_for(self.launcher in CLUSTER_LAUNCHERS),
        )


def step_settings(
    *,
    launcher: str,
    model_name: str,
    epochs: int,
    learning_rate: float,
    batch_size: int,
    seed: int,
    gpus_per_node: int,
    nodes: int,
    gpu_type: str,
    gpu_node_selector: dict[str, Any],
    object_store_secret: str,
    trainer_runtime: str,
    image_pull_secrets: list[str],
    job_labels: dict[str, Any],
    job_annotations: dict[str, Any],
    job_env: dict[str, Any],
    gang_queue: str,
    gang_priority_class: str,
    one_worker_per_node: bool,
    gpu_hour_usd: float,
    gpu_prices: dict[str, Any],
    train_config_json: str | dict[str, Any],
    hyperparams_json: str | dict[str, Any],
    tuned_hyperparams_json: str | dict[str, Any] = "{}",
    cuda_image: str = "",
    cpu_image: str = "",
) -> dict[str, Any]:
    """The train step's settings (a :class:`TrainStepConfig` dict) for pipeline parameters.

    The one mapping from the training pipeline's parameters (same names, documented and
    defaulted once, in the pipeline's signature) to the train step's config: the train and tune
    components and ``gpupipe render`` all call it, so a trial, the rendered job and the trained
    model start from the same settings. Overrides apply in this order: ``train_config_json``
    (any ``TrainStepConfig`` field), ``hyperparams_json`` (the user's dotted overrides),
    ``tuned_hyperparams_json`` (the tune step's best parameters). The result is not validated:
    ``from_dict(TrainStepConfig, ...)`` does that.

    The cluster parameters (``gpu_type`` to ``one_worker_per_node``) fill the ``cluster``
    section of the ``pytorchjob`` and ``trainjob`` launchers; ``trainer_runtime`` only a
    TrainJob's. ``gpus_per_node`` is the run's, whatever the launcher. ``gpu_hour_usd`` and
    ``gpu_prices`` price a GPU-hour of ``gpu_type`` (:func:`trainer.base.cost.resolve_price`).

    Args:
        tuned_hyperparams_json: the tune step's best parameters (its output, not a pipeline
            parameter), applied last.
        cuda_image: the cluster job's image with GPUs (the pipeline passes the package's).
        cpu_image: the cluster job's image without GPUs.

    Raises:
        InputError: ``E_CONFIG`` when a JSON parameter is not a JSON object; ``E_PARAM`` for a
            bad price (naming ``gpu_hour_usd`` or ``gpu_prices``).
    """
    settings: dict[str, Any] = {
        "launcher": launcher,
        "gpus_per_node": gpus_per_node,
        "nnodes": nodes,
        "model": {"name": model_name},
        "optim": {"lr": learning_rate},
        "train": {"seed": seed},
        "watch": {"gpu_hour_usd": resolve_price(gpu_type, gpu_hour_usd, gpu_prices)},
    }
    if epochs > 0:
        settings["train"]["epochs"] = epochs
    if batch_size > 0:
        settings["train"]["global_batch_size"] = batch_size
    if launcher in CLUSTER_LAUNCHERS:
        settings["cluster"] = {
            "image": cuda_image if gpus_per_node > 0 else cpu_image,
            "gpu_resource": gpu_type,
            "node_selector": {str(k): str(v) for k, v in gpu_node_selector.items()},
            "object_store_secret": object_store_secret or None,
            "image_pull_secrets": list(image_pull_secrets),
            "labels": dict(job_labels),
            "annotations": dict(job_annotations),
            "env": dict(job_env),
            "gang_queue": gang_queue or None,
            "gang_priority_class": gang_priority_class or None,
            "one_worker_per_node": bool(one_worker_per_node),
        }
        if launcher == "trainjob":
            settings["cluster"]["runtime"] = trainer_runtime
    layers = {
        "train_config_json": train_config_json,
        "hyperparams_json": hyperparams_json,
        "tuned_hyperparams_json": tuned_hyperparams_json,
    }
    for name, overrides in layers.items():
        settings = apply_overrides(settings, json_object(overrides, name, "E_CONFIG"))
    return record_fixed(settings)


def record_fixed(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` (a :class:`TrainStepConfig` dict) with the settings-from-data fields it sets
    listed under ``auto.fixed``: the user's values win over the data's, even where they equal
    the defaults. Build a step config from a dict of the user's settings through this."""
    given = [
        f
        for f in AUTO_FIELDS
        if isinstance(section := settings.get(f.split(".")[0]), dict)
        and f.split(".", 1)[1] in section
    ]
    auto = settings.get("auto")
    if not given or (auto is not None and not isinstance(auto, dict)):
        return settings  # a malformed auto section is from_dict's to report
    auto = dict(auto or {})
    fixed = auto.get("fixed", [])
    auto["fixed"] = sorted({*fixed, *given}) if isinstance(fixed, list) else fixed
    return {**settings, "auto": auto}


@dataclass
class TrainStepResult:
    """Where the model went and what it reported."""

    model_uri: str
    metrics: dict[str, float]
    steps: int
    job_name: str
    cost: dict[str, Any] = field(default_factory=dict)
    """The estimate before launch and the actual (``cost.json``)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_uri": self.model_uri,
            "metrics": self.metrics,
            "steps": self.steps,
            "job_name": self.job_name,
            "cost": self.cost,
        }


def read_schema(dataset_uri: str) -> dict[str, Any]:
    """The preprocess step's ``schema.json`` of a dataset directory.

    Raises:
        InputError: the dataset has no readable schema.
    """
    uri = storage.join(dataset_uri, "schema.json")
    if not storage.exists(uri):
        raise InputError("E_DATA", "dataset has no schema.json: is it a preprocess output?", uri)
    schema = storage.read_json(uri)
    for key in ("target", "task", "features"):
        if key not in schema:
            raise InputError("E_DATA", f"schema.json has no {key!r}", uri)
    return dict(schema)


def _check_batch_fits(schema: dict[str, Any], batch_size: int, dataset_uri: str) -> None:
    """Fail before launching when the training split is smaller than one global batch.

    The job would fail the same way, but only preprocess's record knows the user's data file,
    so the message can name it and the pipeline parameter to change (``batch_size``).
    """
    rows = (schema.get("splits") or {}).get("train")
    if not isinstance(rows, int) or rows >= batch_size:
        return
    smaller = 1 << (rows.bit_length() - 1) if rows > 0 else 0
    source = schema.get("source") or dataset_uri
    raise InputError(
        "E_CONFIG",
        f"batch_size {batch_size} (train.global_batch_size) is larger than the training split "
        f"of {source} ({rows} rows): training needs one full batch; add rows"
        + (f", or lower it, e.g. --param batch_size={smaller}" if smaller else ""),
        "batch_size",
    )


def _split_rows(schema: dict[str, Any], dataset_uri: str, split: str) -> int | None:
    """Rows of a split: from preprocess's record, else the Parquet footer (0 if absent, None
    if unreadable: the job reports an unreadable file better than this guess can)."""
    rows = (schema.get("splits") or {}).get(split)
    if isinstance(rows, int):
        return rows
    uri = storage.join(dataset_uri, f"{split}.parquet")
    if not storage.exists(uri):
        return 0
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with storage.open_input(uri) as f:
            return int(pq.ParquetFile(f).metadata.num_rows)
    except (OSError, pa.ArrowException):
        return None


def _mlp_params(cfg: TrainStepConfig, schema: dict[str, Any]) -> int | None:
    """Parameters of the built-in MLP for this table (None for other models)."""
    m = cfg.model
    if m.name != "mlp":
        return None
    classes = schema.get("classes")
    out = len(classes) if schema["task"] == "classification" and isinstance(classes, list) else 1
    width, total = len(schema["features"]), 0
    if m.embedding == "periodic" and m.num_layers:
        f, d = EMBEDDING_FREQUENCIES, EMBEDDING_DIM
        total = width * (2 * f + (d - 1) * (f + 1))
        width *= EMBEDDING_DIM
    k = m.ensemble if m.num_layers else 1
    total += width * k if k > 1 else 0  # the members' sign vectors
    for _ in range(m.num_layers):
        total += (width + 1) * m.hidden_dim
        width = m.hidden_dim
    return total + (width + 1) * out * k


def _target_scale(schema: dict[str, Any], dataset_uri: str) -> list[float] | None:
    """``[mean, std]`` of the training split's regression target (preprocess's stats.json, else
    the target column itself); None for classification."""
    if schema["task"] != "regression":
        return None
    stats_uri = storage.join(dataset_uri, "stats.json")
    train: dict[str, Any] = {}
    if storage.exists(stats_uri):
        train = ((storage.read_json(stats_uri).get("target") or {}).get("train")) or {}
    mean, std = train.get("mean"), train.get("std")
    if not isinstance(mean, int | float) or not isinstance(std, int | float):
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            with storage.open_input(storage.join(dataset_uri, "train.parquet")) as f:
                y = pq.read_table(f, columns=[schema["target"]]).column(0).to_numpy()
        except (OSError, pa.ArrowException, KeyError):
            return None  # the job reports the unreadable split or missing column
        y = np.asarray(y, dtype=np.float64)
        mean, std = (float(y.mean()), float(y.std())) if y.size else (0.0, 1.0)
    if not (math.isfinite(mean) and math.isfinite(std)):
        return None
    return [float(mean), float(std) if std > 0 else 1.0]


def plan_worker_config(
    cfg: TrainStepConfig, *, dataset_uri: str, model_uri: str, work_uri: str
) -> tuple[WorkerConfig, AutoSettings | None]:
    """The worker config for a preprocessed dataset, and the settings chosen from the data.

    Splits, schema and target come from the dataset; with ``cfg.auto`` on, the batch, epochs,
    warmup, early stopping and evaluation period the user left alone are chosen from the table
    and model size (:func:`trainer.steps.train.auto_settings.choose_settings`), and a regression
    target is standardised with the training split's mean and standard deviation.
    """
    schema = read_schema(dataset_uri)
    train_section, optim_section, auto = cfg.train, cfg.optim, None
    val_uri = storage.join(dataset_uri, "val.parquet")
    has_val = storage.exists(val_uri)
    n_train = _split_rows(schema, dataset_uri, "train")
    if cfg.auto.enabled and n_train is not None:
        auto = choose_settings(
            cfg.train,
            cfg.optim,
            n_train=n_train,
            n_val=(_split_rows(schema, dataset_uri, "val") or 0) if has_val else 0,
            n_params=_mlp_params(cfg, schema),
            world_size=processes_per_node(cfg.gpus_per_node) * cfg.nnodes,
            fixed=cfg.auto.fixed,
            min_steps=cfg.auto.min_steps,
        )
        train_section, optim_section = auto.train, auto.optim
        log.info(auto.summary())
    _check_batch_fits(schema, train_section.global_batch_size, dataset_uri)
    scale = _target_scale(schema, dataset_uri) if cfg.auto.target_scaling else None
    worker = from_dict(
        WorkerConfig,
        {
            "data": {
                "train_uri": storage.join(dataset_uri, "train.parquet"),
                "val_uri": val_uri if has_val else None,
                "kind": "tabular",
                "target": schema["target"],
                "task": schema["task"],
                "features": list(schema["features"]),
                "schema_uri": storage.join(dataset_uri, "schema.json"),
                "target_scale": scale,
            },
            "model": to_dict(cfg.model),
            "optim": to_dict(optim_section),
            "train": to_dict(train_section),
            "dist": to_dict(cfg.dist),
            "checkpoint": {
                "uri": storage.join(work_uri, "checkpoints"),
                "every_steps": cfg.checkpoint_every_steps,
            },
            "output": {
                "model_uri": model_uri,
                "history_uri": storage.join(work_uri, "history.jsonl"),
            },
        },
    )
    return worker, auto


def build_worker_config(
    cfg: TrainStepConfig, *, dataset_uri: str, model_uri: str, work_uri: str
) -> WorkerConfig:
    """The worker config for a preprocessed dataset (see :func:`plan_worker_config`)."""
    worker, _ = plan_worker_config(
        cfg, dataset_uri=dataset_uri, model_uri=model_uri, work_uri=work_uri
    )
    return worker


def train_step(
    cfg: TrainStepConfig,
    *,
    dataset_uri: str,
    model_uri: str,
    work_uri: str,
    job_name: str,
    launcher: Launcher | None = None,
) -> TrainStepResult:
    """Write the worker config under ``work_uri``, launch the job, return the model's metrics.

    ``work_uri`` must be stable across retries of the step: it holds the checkpoints a retried
    step resumes from. Both it and ``model_uri`` must be absent, empty, or this step's own
    earlier output (see :mod:`trainer.outputs`); anything else fails with ``E_OUTPUT`` before
    the job starts.
    """
    # Before any work: the model and the work folder must be new, empty or ours.
    outputs.check_output_location(
        model_uri, "train", inputs={"dataset": dataset_uri, "work folder": work_uri}
    )
    work_inputs = {"dataset": dataset_uri, "model folder": model_uri}
    outputs.check_output_location(work_uri, "train-work", inputs=work_inputs)
    worker_cfg, auto = plan_worker_config(
        cfg, dataset_uri=dataset_uri, model_uri=model_uri, work_uri=work_uri
    )
    estimate = estimate_before_launch(
        cfg.watch,
        worker_cfg,
        port=cfg.watch.port_for(cfg.launcher in CLUSTER_LAUNCHERS),
        rows=_split_rows(read_schema(dataset_uri), dataset_uri, "train"),
        nnodes=cfg.nnodes,
        gpus_per_node=cfg.gpus_per_node,
        gpus_found=cfg.launcher in CLUSTER_LAUNCHERS or _cuda_here(),
    )
    outputs.claim_output_dir(work_uri, "train-work", inputs=work_inputs)
    config_uri = storage.join(work_uri, "worker-config.json")
    storage.write_text(config_uri, to_json(worker_cfg))
    if launcher is None:
        launcher = make_launcher(cfg)
    launcher.launch(cfg.training_run(job_name=job_name, config_uri=config_uri))
    history = storage.join(work_uri, "history.jsonl")
    if storage.exists(history):
        storage.write_bytes(storage.join(model_uri, "history.jsonl"), storage.read_bytes(history))
    if auto is not None:  # shown by evaluate's report
        storage.write_json(storage.join(model_uri, AUTO_SETTINGS_FILE), auto.to_dict())
    metrics = storage.read_json(storage.join(model_uri, "metrics.json"))
    meta = storage.read_json(storage.join(model_uri, "model.json"))
    steps = int(meta.get("extra", {}).get("train", {}).get("steps", 0))
    return TrainStepResult(
        model_uri=model_uri,
        metrics={k: float(v) for k, v in metrics.items()},
        steps=steps,
        job_name=job_name,
        cost=record_cost(model_uri, estimate),
    )


def make_launcher(cfg: TrainStepConfig) -> Launcher:
    """The launcher ``cfg.launcher`` names, configured from the step's cluster settings."""
    if cfg.launcher == "local":
        # The job's environment (job_env) goes to its workers wherever they run: here too.
        return (
            LocalLauncher(env={**os.environ, **cfg.cluster.env})
            if cfg.cluster.env
            else LocalLauncher()
        )
    from trainer.launch.pytorchjob import PyTorchJobLauncher
    from trainer.launch.trainjob import TrainJobLauncher

    namespace = cfg.cluster.namespace or os.environ.get("POD_NAMESPACE")
    if not namespace:
        raise InputError(
            "E_CONFIG",
            f"the {cfg.launcher} launcher needs a namespace: set "
            "train.cluster.namespace or POD_NAMESPACE (downward API)",
            "train.cluster.namespace",
        )
    cls = TrainJobLauncher if cfg.launcher == "trainjob" else PyTorchJobLauncher
    return cls.from_environment(
        cluster=cfg.cluster, namespace=namespace, on_exit=cfg.cluster.on_exit
    )
