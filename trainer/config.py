"""The worker's config schema: what ``python -m trainer.worker --config <uri>`` reads.

One keyword-only dataclass per section (data, model, optim, train, checkpoint, output, dist,
metrics),
each field documented and checked in ``__post_init__`` with a message naming it. The steps
build a :class:`WorkerConfig`, serialise it to the JSON the training job reads, and the worker
loads it back with :func:`load_worker_config`: a bad config fails in the component, before any
GPU is requested. The machinery (``require``, ``from_dict``, ``to_json``, overrides) is
:mod:`trainer.base.typedconfig`. Torch-free: ``pipelines`` reads it for the parameter list.

Compiled component bodies (the golden pipeline YAML, and pipelines already uploaded to KFP)
run ``from trainer.config import from_dict`` and ``apply_overrides``: both names stay here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from trainer.base.errors import InputError
from trainer.base.typedconfig import apply_overrides, from_dict, require

__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "DistConfig",
    "EarlyStoppingConfig",
    "MetricsConfig",
    "ModelConfig",
    "OptimConfig",
    "OutputConfig",
    "PrecisionName",
    "StrategyName",
    "Task",
    "TrainConfig",
    "WorkerConfig",
    "apply_overrides",
    "from_dict",
    "load_worker_config",
]

Task = Literal["classification", "regression"]
PrecisionName = Literal["auto", "fp32", "bf16", "fp16"]
StrategyName = Literal["auto", "ddp", "fsdp"]


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Where the training data lives and how it is read."""

    train_uri: str
    """Parquet file or folder of Parquet files with the training rows (any storage URI)."""
    val_uri: str | None = None
    """Parquet with validation rows; evaluation and early stopping need it."""
    kind: Literal["tabular", "tokens"] = "tabular"
    """``tabular``: numeric feature columns plus a target; ``tokens``: one flat token-id column."""
    target: str | None = "label"
    """Target column (tabular only)."""
    features: list[str] | None = None
    """Feature columns in order (tabular only); ``None`` takes every column except the target."""
    task: Task = "classification"
    """Tabular task; decides the loss (cross entropy or mean squared error)."""
    token_column: str = "tokens"
    """Column of token ids (tokens only)."""
    seq_len: int = 256
    """Tokens per training sequence (tokens only)."""
    schema_uri: str | None = None
    """``schema.json`` written by preprocess; copied into the model's metadata for serving."""
    max_memory_mb: int = 4096
    """Tabular Parquet whose uncompressed size exceeds this is streamed row group by row group."""
    shuffle: bool = True
    """Shuffle training rows each epoch (seeded by ``train.seed`` and the epoch)."""
    eval_batch_size: int = 1024
    """Rows per rank per evaluation batch."""
    target_scale: list[float] | None = None
    """Regression: ``[mean, std]`` of the training target; the model learns
    ``(target - mean) / std``, validation RMSE is reported in the target's units, and the model
    artifact records the scale so that predictions come back in those units. ``None``: raw."""

    def __post_init__(self) -> None:
        require(bool(self.train_uri), "data.train_uri", "must be set", self.train_uri)
        if self.kind == "tabular":
            require(
                bool(self.target), "data.target", "must name a column for tabular data", self.target
            )
            if self.features is not None:
                require(len(self.features) > 0, "data.features", "must not be empty", self.features)
                require(
                    self.target not in self.features,
                    "data.features",
                    f"must not contain the target {self.target!r}",
                    self.features,
                )
                dupes = sorted({f for f in self.features if self.features.count(f) > 1})
                require(not dupes, "data.features", f"has duplicate columns {dupes}", self.features)
        require(self.seq_len > 0, "data.seq_len", "must be > 0", self.seq_len)
        require(self.max_memory_mb > 0, "data.max_memory_mb", "must be > 0", self.max_memory_mb)
        require(
            self.eval_batch_size > 0, "data.eval_batch_size", "must be > 0", self.eval_batch_size
        )
        if self.target_scale is not None:
            ok = len(self.target_scale) == 2 and all(map(math.isfinite, self.target_scale))
            require(
                ok and self.target_scale[1] > 0 and self.task == "regression",
                "data.target_scale",
                "must be [mean, std > 0] (finite) of a regression target",
                self.target_scale,
            )


EMBEDDING_FREQUENCIES = 16
"""Frequencies per column of the periodic numerical embedding (trainer/models/embeddings.py)."""
EMBEDDING_DIM = 4
"""Numbers per column out of the periodic embedding, the column itself included."""


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Which model to build: a built-in by name, a user model by ``package.module:build``."""

    name: str = "mlp"
    """``mlp`` (tabular), ``gpt`` (tokens) or ``package.module:build`` for a user model."""
    hidden_dim: int = 128
    """MLP: width of each hidden layer."""
    num_layers: int = 2
    """MLP: number of hidden layers."""
    dropout: float = 0.0
    """Dropout probability (MLP hidden layers, GPT residual and attention)."""
    activation: Literal["relu", "gelu", "silu"] = "gelu"
    """MLP: activation between layers."""
    linear: Literal["fit", "none"] = "fit"
    """MLP: ``fit`` adds a linear path from the inputs to the outputs, fitted to the training
    rows before the first step (ridge or L2 logistic regression, as scikit-learn's baselines)
    with the hidden layers' output starting at zero: training starts from the linear model and
    learns what it misses (with ``num_layers`` 0 the whole model starts from the fit). ``none``:
    a plain MLP from its random initialisation (models saved before this option load as
    ``none``)."""
    embedding: Literal["periodic", "periodic+ple", "none"] = "periodic"
    """MLP: ``periodic`` feeds the hidden layers each input column through learned periodic
    features (RealMLP's PBLD embedding, after a soft clipping of the standardised value: see
    :mod:`trainer.models.embeddings`), which lets the MLP follow cycles and thresholds in one
    column; the linear path still reads the plain inputs. ``periodic+ple``: those and a
    piecewise-linear encoding of each column with bins cut at quantiles of the training rows
    (steps at any cut, e.g. at the values of a year column). ``none``: the plain inputs (models
    saved before this option load as ``none``)."""
    ensemble: int = 8
    """MLP: ``k`` > 1 trains ``k`` MLPs in one (TabM-mini: each member scales the first layer's
    input by its own random signs and has its own head, the layers between are shared), each
    on its own loss, and predicts their average (probabilities for classification); about
    ``k`` times the compute of one MLP, for better scores and calibrated probabilities on most
    tables (``benchmarks/README.md``, default_models). 1: one MLP (models saved before this
    option load as 1)."""
    vocab_size: int = 50304
    """GPT: vocabulary size (a multiple of 64 keeps the output matmul efficient)."""
    n_layer: int = 12
    """GPT: transformer blocks."""
    n_head: int = 12
    """GPT: attention heads per block."""
    d_model: int = 768
    """GPT: embedding width; must divide by ``n_head``."""
    activation_checkpointing: bool = False
    """GPT: recompute each block's activations in the backward pass to save memory."""
    loss_chunk: int = 8192
    """GPT: tokens per chunk of the fused head + cross-entropy, which never holds the full
    ``[batch, seq, vocab]`` logits (the largest is ``[loss_chunk, vocab]``, 0.8 GB in bf16 at
    vocab 50304; fewer, larger chunks mean fewer passes over the fp32 weight gradient); 0
    computes the loss from the full logits (the old path, kept to compare against)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Free-form keyword arguments handed to a user model's ``build`` function."""

    def __post_init__(self) -> None:
        builtin = self.name in ("mlp", "gpt")
        plugin = ":" in self.name and all(p for p in self.name.split(":", 1))
        require(
            builtin or plugin,
            "model.name",
            "must be 'mlp', 'gpt' or 'package.module:build'",
            self.name,
        )
        require(self.hidden_dim > 0, "model.hidden_dim", "must be > 0", self.hidden_dim)
        require(self.num_layers >= 0, "model.num_layers", "must be >= 0", self.num_layers)
        require(self.ensemble >= 1, "model.ensemble", "must be >= 1", self.ensemble)
        require(0.0 <= self.dropout < 1.0, "model.dropout", "must be in [0, 1)", self.dropout)
        require(self.vocab_size > 1, "model.vocab_size", "must be > 1", self.vocab_size)
        require(self.n_layer > 0, "model.n_layer", "must be > 0", self.n_layer)
        require(self.n_head > 0, "model.n_head", "must be > 0", self.n_head)
        require(self.loss_chunk >= 0, "model.loss_chunk", "must be >= 0", self.loss_chunk)
        require(
            self.d_model > 0 and self.d_model % self.n_head == 0,
            "model.d_model",
            f"must be > 0 and divisible by model.n_head={self.n_head}",
            self.d_model,
        )


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    """AdamW and its learning-rate schedule."""

    lr: float = 1e-3
    """Peak learning rate, reached at the end of warmup."""
    weight_decay: float = 0.01
    """Decoupled weight decay; applied to matrices only, never to biases or norms."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.999
    """AdamW beta2."""
    eps: float = 1e-8
    """AdamW epsilon."""
    fused: bool | None = None
    """Fused AdamW kernel; ``None`` uses it on CUDA and not on CPU."""
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    """Decay after warmup."""
    warmup_steps: int = 0
    """Optimizer steps of linear warmup from 0 to ``lr``."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of ``lr`` (cosine and linear)."""
    grad_clip: float | None = 1.0
    """Clip the global gradient norm to this; ``None`` disables clipping."""

    def __post_init__(self) -> None:
        require(self.lr > 0, "optim.lr", "must be > 0", self.lr)
        require(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0", self.weight_decay)
        require(0 <= self.beta1 < 1, "optim.beta1", "must be in [0, 1)", self.beta1)
        require(0 <= self.beta2 < 1, "optim.beta2", "must be in [0, 1)", self.beta2)
        require(self.eps > 0, "optim.eps", "must be > 0", self.eps)
        require(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0", self.warmup_steps)
        require(
            0 <= self.min_lr_ratio <= 1,
            "optim.min_lr_ratio",
            "must be in [0, 1]",
            self.min_lr_ratio,
        )
        require(
            self.grad_clip is None or self.grad_clip > 0,
            "optim.grad_clip",
            "must be > 0 or null",
            self.grad_clip,
        )


@dataclass(kw_only=True, slots=True)
class EarlyStoppingConfig:
    """Stop when a validation metric has not improved for ``patience`` evaluations."""

    metric: str = "val_loss"
    """Metric from the evaluation (``val_loss``, ``val_accuracy``, ``val_rmse``)."""
    mode: Literal["min", "max"] = "min"
    """Whether smaller or larger is better."""
    patience: int = 3
    """Evaluations without improvement before stopping."""
    min_delta: float = 0.0
    """Smallest change that counts as an improvement."""

    def __post_init__(self) -> None:
        require(
            self.metric.startswith("val_"),
            "train.early_stopping.metric",
            "must be a validation metric (val_*)",
            self.metric,
        )
        require(self.patience > 0, "train.early_stopping.patience", "must be > 0", self.patience)
        require(
            self.min_delta >= 0, "train.early_stopping.min_delta", "must be >= 0", self.min_delta
        )


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """The training loop: length, batch, precision, evaluation and failure handling."""

    epochs: int = 10
    """Passes over the training data."""
    max_steps: int | None = None
    """Stop after this many optimizer steps, whatever ``epochs`` says."""
    global_batch_size: int = 256
    """Samples per optimizer step, summed over all ranks and accumulation steps."""
    micro_batch_size: int | None = None
    """Samples per forward pass per rank; ``None``: global batch / world size (no accumulation)."""
    min_micro_batch_size: int = 1
    """An out-of-memory error halves the micro-batch down to this, then fails."""
    seed: int = 0
    """Seeds model initialisation, shuffling and dropout; same seed, same weights."""
    precision: PrecisionName = "auto"
    """``auto`` picks bf16 on GPUs that support it, else fp32; fp16 uses a gradient scaler."""
    compile: bool = False
    """``torch.compile`` the model (worth it on GPUs for long runs); under FSDP, block by block."""
    strategy: StrategyName = "auto"
    """``ddp`` (every rank holds the whole model), ``fsdp`` (FSDP2: parameters, gradients and
    optimizer state sharded over the ranks, per transformer block and at the root) or ``auto``:
    FSDP when that state would not leave room for activations on one GPU, else DDP (always DDP on
    CPU devices). The choice is logged."""
    fsdp_cpu_offload: bool = False
    """FSDP on CUDA: keep the sharded parameters, gradients and optimizer state in CPU memory
    (the optimizer steps on the CPU); slower, for models whose shards still do not fit."""
    tf32: bool = True
    """Allow TF32 tensor cores for fp32 matmuls on CUDA."""
    prefetch: bool = True
    """Prepare the next batches on a background thread while the current step runs; on CUDA
    they are copied from pinned memory on a side stream, so the GPU does not wait on data.
    Batches and their order are the same either way; off, the loop reads the stream inline."""
    eval_every_steps: int | None = None
    """Evaluate every N optimizer steps; ``None`` evaluates at the end of each epoch."""
    log_every_steps: int = 10
    """Emit a JSON log line every N optimizer steps (values are synced only then)."""
    early_stopping: EarlyStoppingConfig | None = None
    """Stop early on a validation metric; needs ``data.val_uri``."""
    calibrate: bool = True
    """With validation rows, after training (:mod:`trainer.training.calibration`): a classifier
    fits one temperature that divides its logits (temperature scaling: the validation log loss
    falls, the predicted classes stay), then a tabular MLP that started from the linear fit
    mixes that linear model's predictions into its own, with a share fitted on the validation
    rows. Both are stored in the model. False: the network's raw outputs (models saved before
    this option load with temperature 1 and share 0)."""
    max_nan_rollbacks: int = 3
    """A NaN/Inf loss rolls back to the last checkpoint this many times before the run fails."""
    nan_lr_factor: float = 0.5
    """Each rollback multiplies the learning rate by this factor."""
    metrics_stdout: bool = False
    """After each evaluation, also print one ``name=value`` line per metric (``val_loss=0.123``)
    on stdout, for Katib's StdOut metrics collector (Katib trials set it)."""

    def __post_init__(self) -> None:
        require(self.epochs > 0, "train.epochs", "must be > 0", self.epochs)
        require(
            self.max_steps is None or self.max_steps > 0,
            "train.max_steps",
            "must be > 0 or null",
            self.max_steps,
        )
        require(
            self.global_batch_size > 0,
            "train.global_batch_size",
            "must be > 0",
            self.global_batch_size,
        )
        if self.micro_batch_size is not None:
            require(
                0 < self.micro_batch_size <= self.global_batch_size,
                "train.micro_batch_size",
                f"must be in [1, train.global_batch_size={self.global_batch_size}]",
                self.micro_batch_size,
            )
        require(
            self.strategy in get_args(StrategyName),
            "train.strategy",
            f"must be one of {list(get_args(StrategyName))}",
            self.strategy,
        )
        require(
            not self.fsdp_cpu_offload or self.strategy != "ddp",
            "train.fsdp_cpu_offload",
            "needs train.strategy 'fsdp' or 'auto'",
            self.fsdp_cpu_offload,
        )
        require(
            self.min_micro_batch_size > 0,
            "train.min_micro_batch_size",
            "must be > 0",
            self.min_micro_batch_size,
        )
        require(
            self.eval_every_steps is None or self.eval_every_steps > 0,
            "train.eval_every_steps",
            "must be > 0 or null",
            self.eval_every_steps,
        )
        require(
            self.log_every_steps > 0, "train.log_every_steps", "must be > 0", self.log_every_steps
        )
        require(
            self.max_nan_rollbacks >= 0,
            "train.max_nan_rollbacks",
            "must be >= 0",
            self.max_nan_rollbacks,
        )
        require(
            0 < self.nan_lr_factor <= 1,
            "train.nan_lr_factor",
            "must be in (0, 1]",
            self.nan_lr_factor,
        )


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """Resumable checkpoints."""

    uri: str | None = None
    """Folder for ``step-<n>/`` checkpoints; ``None`` disables checkpoints (and NaN rollback)."""
    every_steps: int = 100
    """Write a checkpoint every N optimizer steps (and at the end of each epoch)."""
    keep_last: int = 3
    """Keep the newest N complete checkpoints."""
    resume: bool = True
    """Resume from the newest complete checkpoint under ``uri`` if one exists."""

    def __post_init__(self) -> None:
        require(self.every_steps > 0, "checkpoint.every_steps", "must be > 0", self.every_steps)
        require(self.keep_last > 0, "checkpoint.keep_last", "must be > 0", self.keep_last)


@dataclass(kw_only=True, slots=True)
class OutputConfig:
    """Where the results go."""

    model_uri: str
    """Folder that receives ``model.safetensors``, ``model.json`` and ``metrics.json``."""
    history_uri: str | None = None
    """Optional JSON-lines file with every logged step and evaluation (for loss-curve plots)."""

    def __post_init__(self) -> None:
        require(bool(self.model_uri), "output.model_uri", "must be set", self.model_uri)


@dataclass(kw_only=True, slots=True)
class DistConfig:
    """Process-group settings."""

    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """``auto``: NCCL on CUDA, gloo on CPU."""
    timeout_s: int = 1800
    """Collective timeout; a hung rank fails the job after this long instead of forever."""

    def __post_init__(self) -> None:
        require(self.timeout_s > 0, "dist.timeout_s", "must be > 0", self.timeout_s)


@dataclass(kw_only=True, slots=True)
class MetricsConfig:
    """The Prometheus endpoint and what a GPU-hour costs (``trainer/training/prom.py``)."""

    port: int = 0
    """Serve ``/metrics`` (Prometheus text format) on this port from each node's first process
    (training values from rank 0, GPU values of every rank on the node); 0: no endpoint."""
    host: str = "auto"
    """Address the endpoint listens on. ``auto``: ``127.0.0.1`` (this machine only) unless the
    process runs in a Kubernetes pod (``KUBERNETES_SERVICE_HOST`` is set), then every interface
    of the pod (``0.0.0.0``), where a scrape of the pod's IP reaches it. The address it really
    listens on is what the run prints."""
    gpu_hour_usd: float | None = None
    """Price of one GPU-hour; with it the ``cost_usd`` counter and the run's cost are reported
    (``None``: no cost)."""
    gpus: int = 0
    """GPUs the job holds and is billed for (nodes x GPUs per node); 0: one per process. Only
    counted while the processes drive CUDA devices: a run on the CPU records no GPU-hours."""

    def __post_init__(self) -> None:
        require(0 <= self.port <= 65535, "metrics.port", "must be 0 to 65535", self.port)
        require(bool(self.host), "metrics.host", "must be set", self.host)
        require(
            self.gpu_hour_usd is None
            or (math.isfinite(self.gpu_hour_usd) and self.gpu_hour_usd >= 0),
            "metrics.gpu_hour_usd",
            "must be >= 0 or null",
            self.gpu_hour_usd,
        )
        require(self.gpus >= 0, "metrics.gpus", "must be >= 0", self.gpus)


@dataclass(kw_only=True, slots=True)
class WorkerConfig:
    """Everything ``python -m trainer.worker`` needs; serialised as the job's config JSON."""

    data: DataConfig
    output: OutputConfig
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def __post_init__(self) -> None:
        if self.train.early_stopping is not None:
            require(
                self.data.val_uri is not None,
                "data.val_uri",
                "must be set when train.early_stopping is on",
                self.data.val_uri,
            )
        if self.model.name == "mlp":
            require(
                self.data.kind == "tabular",
                "data.kind",
                "must be 'tabular' for model 'mlp'",
                self.data.kind,
            )
        if self.model.name == "gpt":
            require(
                self.data.kind == "tokens",
                "data.kind",
                "must be 'tokens' for model 'gpt'",
                self.data.kind,
            )


def load_worker_config(uri: str, overrides: list[str] | None = None) -> WorkerConfig:
    """Read a worker config JSON from any storage URI, apply overrides, validate.

    Raises:
        ValueError: unreadable JSON or an invalid config, naming the URI or key.
    """
    from trainer.base import storage

    try:
        data = json.loads(storage.read_bytes(uri))
    except json.JSONDecodeError as e:
        raise InputError("E_CONFIG", f"config is not valid JSON: {e}", uri) from e
    if not isinstance(data, dict):
        raise InputError(
            "E_CONFIG", f"config must hold a JSON object, got {type(data).__name__}", uri
        )
    return from_dict(WorkerConfig, apply_overrides(data, overrides or []))
