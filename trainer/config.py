"""Typed, self-validating configuration for the training worker and the steps.

Every section is a keyword-only dataclass whose fields carry their own documentation and whose
``__post_init__`` rejects bad values with a message naming the field (``train.epochs must be > 0,
got -3``). ``from_dict`` rejects unknown keys and wrong types with the dotted path of the key, so a
bad config fails in the component, before any GPU is requested. The same dataclasses serialise to
the JSON that components hand to the training job.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from trainer.errors import InputError

Task = Literal["classification", "regression"]
PrecisionName = Literal["auto", "fp32", "bf16", "fp16"]
StrategyName = Literal["auto", "ddp", "fsdp"]

T = TypeVar("T")


def require(ok: bool, name: str, rule: str, value: Any) -> None:
    """Raise a one-line error naming the field, the rule and the offending value.

    Raises:
        InputError: ``E_CONFIG`` naming ``name`` when ``ok`` is false.
    """
    if not ok:
        raise InputError("E_CONFIG", f"{name} {rule}, got {value!r}", name)


def json_object(value: str | dict[str, Any] | None, name: str, code: str = "E_PARAM") -> dict:
    """The JSON object that parameter ``name`` holds: as given when already a dict, ``{}`` when
    empty. The one parser of the pipeline's JSON-object parameters.

    Raises:
        InputError: ``code`` naming ``name`` when the text is not a JSON object.
    """
    if isinstance(value, dict):
        return value
    try:
        data = json.loads(value or "{}")
    except json.JSONDecodeError as e:
        raise InputError(code, f"{name} must be a JSON object: {e}", name) from None
    if not isinstance(data, dict):
        raise InputError(code, f"{name} must be a JSON object, got {value!r}", name)
    return data


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
class WorkerConfig:
    """Everything ``python -m trainer.worker`` needs; serialised as the job's config JSON."""

    data: DataConfig
    output: OutputConfig
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    dist: DistConfig = field(default_factory=DistConfig)

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


# --------------------------------------------------------------------------------------------
# Parsing, serialisation and overrides
# --------------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def coerce(value: Any, tp: Any, path: str) -> Any:
    """Check ``value`` against the annotation ``tp``; build nested dataclasses; name ``path``."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None:
            require(type(None) in options, path, "must not be null", value)
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(value, option, path)
            except ValueError as e:
                errors.append(str(e))
        if len(errors) == 1:
            raise InputError("E_CONFIG", errors[0].rsplit(" (", 1)[0], path)
        names = " or ".join(_type_name(o) for o in options)
        raise InputError("E_CONFIG", f"{path} must be {names}, got {value!r}", path)
    if origin is Literal:
        require(value in get_args(tp), path, f"must be one of {list(get_args(tp))}", value)
        return value
    if dataclasses.is_dataclass(tp):
        require(isinstance(value, dict), path or "config", "must be a mapping", value)
        return _from_dict(tp, value, path)  # type: ignore[arg-type]
    if origin is list:
        require(isinstance(value, list), path, "must be a list", value)
        (item_tp,) = get_args(tp)
        return [coerce(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        require(isinstance(value, dict), path, "must be a mapping", value)
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        require(isinstance(value, bool), path, "must be true or false", value)
        return value
    if tp is int:
        # KFP hands ints inside ParallelFor items over as floats: accept integral floats.
        if isinstance(value, float) and value.is_integer():
            return int(value)
        require(
            isinstance(value, int) and not isinstance(value, bool),
            path,
            "must be an integer",
            value,
        )
        return value
    if tp is float:
        require(
            isinstance(value, int | float) and not isinstance(value, bool),
            path,
            "must be a number",
            value,
        )
        return float(value)
    if tp is str:
        require(isinstance(value, str), path, "must be a string", value)
        return value
    raise TypeError(f"unsupported annotation {tp!r} at {path}")  # internal: a field we declared


def _from_dict(cls: type[T], data: dict[str, Any], path: str) -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    prefix = f"{path}." if path else ""
    unknown = sorted(set(data) - set(fields))
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(fields), n=3, cutoff=0.6)
        mean = f"did you mean {' or '.join(prefix + c for c in close)}? " if close else ""
        raise InputError(
            "E_CONFIG",
            f"unknown config key {prefix}{unknown[0]}; {mean}known keys: "
            f"{', '.join(sorted(fields))}",
            f"{prefix}{unknown[0]}",
        )
    kwargs = {name: coerce(value, hints[name], prefix + name) for name, value in data.items()}
    missing = [
        name
        for name, f in fields.items()
        if name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise InputError(
            "E_CONFIG", f"missing required config key {prefix}{missing[0]}", f"{prefix}{missing[0]}"
        )
    return cls(**kwargs)


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build config ``cls`` from plain data, rejecting unknown keys and wrong types.

    Raises:
        ValueError: one line naming the dotted key and the bad value.
    """
    return coerce(data, cls, "")


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain-JSON form of a config dataclass (round-trips through ``from_dict``)."""
    return dataclasses.asdict(cfg)


def to_json(cfg: Any) -> str:
    """Canonical JSON (sorted keys) of a config dataclass."""
    return json.dumps(to_dict(cfg), indent=2, sort_keys=True) + "\n"


def config_hash(cfg: Any) -> str:
    """Short, stable hash of a config, recorded in checkpoints to catch a resumed run's drift."""
    return hashlib.sha256(json.dumps(to_dict(cfg), sort_keys=True).encode()).hexdigest()[:16]


def parse_value(text: str) -> Any:
    """Parse an override's value as JSON (numbers, true/false/null, lists), else keep the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str] | dict[str, Any]) -> dict[str, Any]:
    """Return a copy of ``data`` with dotted ``key=value`` overrides applied.

    ``["optim.lr=0.01", "train.early_stopping.patience=5"]`` or the same as a dict. Intermediate
    sections are created when missing; unknown keys are caught later by ``from_dict``.

    Raises:
        ValueError: an override without ``=`` or one that descends into a non-mapping value.
    """
    out = json.loads(json.dumps(data))
    items: list[tuple[str, Any]]
    if isinstance(overrides, dict):
        items = list(overrides.items())
    else:
        items = []
        for text in overrides:
            key, sep, value = text.partition("=")
            if not sep or not key.strip():
                raise InputError(
                    "E_CONFIG", f"override must look like section.key=value, got {text!r}", "--set"
                )
            items.append((key.strip(), parse_value(value)))
    for key, value in items:
        node = out
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            nxt = node.setdefault(part, {})
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                where = ".".join(parts[: i + 1])
                raise InputError("E_CONFIG", f"override {key}: {where} is not a section", where)
            node = nxt
        node[parts[-1]] = value
    return out


def load_worker_config(uri: str, overrides: list[str] | None = None) -> WorkerConfig:
    """Read a worker config JSON from any storage URI, apply overrides, validate.

    Raises:
        ValueError: unreadable JSON or an invalid config, naming the URI or key.
    """
    from trainer import storage

    try:
        data = json.loads(storage.read_bytes(uri))
    except json.JSONDecodeError as e:
        raise InputError("E_CONFIG", f"config is not valid JSON: {e}", uri) from e
    if not isinstance(data, dict):
        raise InputError(
            "E_CONFIG", f"config must hold a JSON object, got {type(data).__name__}", uri
        )
    return from_dict(WorkerConfig, apply_overrides(data, overrides or []))
