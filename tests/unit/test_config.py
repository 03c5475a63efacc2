"""Worker config: every field's validation, strict parsing, overrides, loading and hashing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from trainer.base.errors import InputError
from trainer.base.typedconfig import apply_overrides, config_hash, from_dict, to_dict, to_json
from trainer.config import WorkerConfig, load_worker_config


def base() -> dict[str, Any]:
    """A minimal valid worker config."""
    return {
        "data": {"train_uri": "/data/train.parquet", "val_uri": "/data/val.parquet"},
        "output": {"model_uri": "/out/model"},
    }


def with_value(dotted: str, value: Any, cfg: dict[str, Any] | None = None) -> dict[str, Any]:
    return apply_overrides(cfg or base(), {dotted: value})


BAD_VALUES = [
    # (dotted key, bad value, fragment of the message)
    ("data.train_uri", "", "data.train_uri must be set, got ''"),
    ("data.target", "", "data.target must name a column for tabular data"),
    ("data.target", None, "data.target must name a column for tabular data"),
    ("data.features", [], "data.features must not be empty"),
    ("data.features", ["a", "label"], "data.features must not contain the target 'label'"),
    ("data.features", ["a", "b", "a"], "data.features has duplicate columns ['a']"),
    ("data.seq_len", 0, "data.seq_len must be > 0, got 0"),
    ("data.max_memory_mb", 0, "data.max_memory_mb must be > 0, got 0"),
    ("data.eval_batch_size", -1, "data.eval_batch_size must be > 0, got -1"),
    ("data.kind", "images", "data.kind must be one of ['tabular', 'tokens'], got 'images'"),
    ("data.task", "ranking", "data.task must be one of ['classification', 'regression']"),
    ("model.name", "resnet", "model.name must be 'mlp', 'gpt' or 'package.module:build'"),
    ("model.name", "pkg.mod:", "model.name must be 'mlp', 'gpt' or 'package.module:build'"),
    ("model.hidden_dim", 0, "model.hidden_dim must be > 0, got 0"),
    ("model.num_layers", -1, "model.num_layers must be >= 0, got -1"),
    ("model.dropout", 1.0, "model.dropout must be in [0, 1), got 1.0"),
    ("model.dropout", -0.1, "model.dropout must be in [0, 1), got -0.1"),
    ("model.activation", "tanh", "model.activation must be one of ['relu', 'gelu', 'silu']"),
    ("model.vocab_size", 1, "model.vocab_size must be > 1, got 1"),
    ("model.n_layer", 0, "model.n_layer must be > 0, got 0"),
    ("model.n_head", 0, "model.n_head must be > 0, got 0"),
    ("model.d_model", 100, "model.d_model must be > 0 and divisible by model.n_head=12, got 100"),
    ("model.options", [1], "model.options must be a mapping, got [1]"),
    ("optim.lr", 0, "optim.lr must be > 0, got 0.0"),
    ("optim.weight_decay", -0.1, "optim.weight_decay must be >= 0, got -0.1"),
    ("optim.beta1", 1.0, "optim.beta1 must be in [0, 1), got 1.0"),
    ("optim.beta2", -0.5, "optim.beta2 must be in [0, 1), got -0.5"),
    ("optim.eps", 0, "optim.eps must be > 0, got 0.0"),
    ("optim.warmup_steps", -1, "optim.warmup_steps must be >= 0, got -1"),
    ("optim.min_lr_ratio", 1.5, "optim.min_lr_ratio must be in [0, 1], got 1.5"),
    ("optim.grad_clip", 0, "optim.grad_clip must be > 0 or null, got 0.0"),
    ("optim.schedule", "step", "optim.schedule must be one of ['cosine', 'linear', 'constant']"),
    ("optim.fused", "yes", "optim.fused must be true or false, got 'yes'"),
    ("train.epochs", -3, "train.epochs must be > 0, got -3"),
    ("train.max_steps", 0, "train.max_steps must be > 0 or null, got 0"),
    ("train.global_batch_size", 0, "train.global_batch_size must be > 0, got 0"),
    ("train.micro_batch_size", 512, "train.micro_batch_size must be in [1, train.global_batch"),
    ("train.micro_batch_size", 0, "train.micro_batch_size must be in [1, train.global_batch"),
    ("train.min_micro_batch_size", 0, "train.min_micro_batch_size must be > 0, got 0"),
    ("train.eval_every_steps", 0, "train.eval_every_steps must be > 0 or null, got 0"),
    ("train.log_every_steps", 0, "train.log_every_steps must be > 0, got 0"),
    ("train.max_nan_rollbacks", -1, "train.max_nan_rollbacks must be >= 0, got -1"),
    ("train.nan_lr_factor", 0, "train.nan_lr_factor must be in (0, 1], got 0.0"),
    ("train.nan_lr_factor", 1.5, "train.nan_lr_factor must be in (0, 1], got 1.5"),
    ("train.precision", "fp8", "train.precision must be one of ['auto', 'fp32', 'bf16', 'fp16']"),
    (
        "train.early_stopping.metric",
        "loss",
        "train.early_stopping.metric must be a validation metric (val_*), got 'loss'",
    ),
    ("train.early_stopping.patience", 0, "train.early_stopping.patience must be > 0, got 0"),
    ("train.early_stopping.min_delta", -1, "train.early_stopping.min_delta must be >= 0"),
    ("train.early_stopping.mode", "up", "train.early_stopping.mode must be one of ['min', 'max']"),
    ("checkpoint.every_steps", 0, "checkpoint.every_steps must be > 0, got 0"),
    ("checkpoint.keep_last", 0, "checkpoint.keep_last must be > 0, got 0"),
    ("checkpoint.resume", 1, "checkpoint.resume must be true or false, got 1"),
    ("output.model_uri", "", "output.model_uri must be set, got ''"),
    ("dist.timeout_s", 0, "dist.timeout_s must be > 0, got 0"),
    ("dist.backend", "mpi", "dist.backend must be one of ['auto', 'nccl', 'gloo'], got 'mpi'"),
    (
        "train.strategy",
        "zero3",
        "train.strategy must be one of ['auto', 'ddp', 'fsdp'], got 'zero3'",
    ),
]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    BAD_VALUES,
    ids=[f"{k}={v!r}" for k, v, _ in BAD_VALUES],
)
def test_bad_value_is_rejected_naming_the_field(key: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        from_dict(WorkerConfig, with_value(key, value))
    assert isinstance(info.value, InputError) and info.value.code == "E_CONFIG"
    assert str(info.value).count("\n") == 0  # one line, as the worker prints it


def test_good_defaults_build() -> None:
    cfg = from_dict(WorkerConfig, base())
    assert cfg.train.epochs == 10 and cfg.model.name == "mlp" and cfg.dist.backend == "auto"
    assert cfg.train.early_stopping is None


UNKNOWN_KEYS = [
    "colour",
    "data.colour",
    "model.colour",
    "optim.colour",
    "train.colour",
    "train.early_stopping.colour",
    "checkpoint.colour",
    "output.colour",
    "dist.colour",
]


@pytest.mark.parametrize("key", UNKNOWN_KEYS, ids=UNKNOWN_KEYS)
def test_unknown_key_at_every_level(key: str) -> None:
    with pytest.raises(ValueError, match=rf"^unknown config key {re.escape(key)}; known keys: "):
        from_dict(WorkerConfig, with_value(key, 1))


def test_unknown_key_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"known keys: .*global_batch_size.*max_steps"):
        from_dict(WorkerConfig, with_value("train.epochz", 3))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"output": {"model_uri": "/m"}}, "missing required config key data"),
        ({**base(), "data": {}}, "missing required config key data.train_uri"),
        ({**base(), "output": {}}, "missing required config key output.model_uri"),
        ({**base(), "train": [1]}, "train must be a mapping, got [1]"),
        ({**base(), "train": None}, "train must be a mapping, got None"),
    ],
    ids=["no-data", "no-train-uri", "no-model-uri", "section-a-list", "section-null"],
)
def test_missing_or_malformed_sections(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        from_dict(WorkerConfig, data)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("train.epochs", "3", "train.epochs must be an integer, got '3'"),
        ("train.epochs", True, "train.epochs must be an integer, got True"),
        ("train.epochs", 2.5, "train.epochs must be an integer, got 2.5"),
        ("train.max_steps", "10", "train.max_steps must be an integer, got '10'"),
        ("train.max_steps", 1.5, "train.max_steps must be an integer, got 1.5"),
        ("optim.lr", "fast", "optim.lr must be a number, got 'fast'"),
        ("optim.lr", True, "optim.lr must be a number, got True"),
        ("optim.grad_clip", "1", "optim.grad_clip must be a number, got '1'"),
        ("data.train_uri", 5, "data.train_uri must be a string, got 5"),
        ("data.val_uri", 5, "data.val_uri must be a string, got 5"),
        ("data.features", "a,b", "data.features must be a list, got 'a,b'"),
        ("data.features", ["a", 2], "data.features[1] must be a string, got 2"),
        ("data.shuffle", "true", "data.shuffle must be true or false, got 'true'"),
        ("data.seq_len", None, "data.seq_len must be an integer, got None"),
        ("train.early_stopping", 3, "train.early_stopping must be a mapping, got 3"),
        ("train.early_stopping.patience", "2", "train.early_stopping.patience must be an integ"),
    ],
    ids=lambda v: "" if isinstance(v, str) and " " in v else repr(v),
)
def test_wrong_types_name_the_key(key: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        from_dict(WorkerConfig, with_value(key, value))


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("train.epochs", 4.0, 4),
        ("train.max_steps", 100.0, 100),
        ("optim.lr", 1, 1.0),
        ("train.max_steps", None, None),
        ("optim.grad_clip", None, None),
    ],
    ids=[
        "int-from-integral-float",
        "optional-int-from-float",
        "float-from-int",
        "null-int",
        "null-float",
    ],
)
def test_accepted_coercions(key: str, value: Any, expected: Any) -> None:
    built = from_dict(WorkerConfig, with_value(key, value))
    section, name = key.split(".")
    got = getattr(getattr(built, section), name)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("data.kind", "tokens"),
        ("optim.schedule", "linear"),
        ("train.precision", "bf16"),
        ("model.activation", "silu"),
        ("dist.backend", "gloo"),
        ("train.early_stopping.mode", "max"),
        ("train.strategy", "fsdp"),
    ],
    ids=lambda v: v if "." in v else None,
)
def test_literal_choices_accepted(key: str, value: str) -> None:
    cfg = with_value(key, value)
    if key == "data.kind":
        cfg = with_value("model.name", "gpt", cfg)
    built = from_dict(WorkerConfig, cfg)
    section, *rest = key.split(".")
    node: Any = getattr(built, section)
    for part in rest:
        node = getattr(node, part)
    assert node == value


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"data.val_uri": None, "train.early_stopping": {}}, "data.val_uri must be set when train"),
        ({"data.kind": "tokens"}, "data.kind must be 'tabular' for model 'mlp', got 'tokens'"),
        ({"model.name": "gpt"}, "data.kind must be 'tokens' for model 'gpt', got 'tabular'"),
    ],
    ids=["early-stopping-needs-val", "mlp-needs-tabular", "gpt-needs-tokens"],
)
def test_cross_section_checks(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        from_dict(WorkerConfig, apply_overrides(base(), overrides))


def test_plugin_model_accepts_any_data_kind() -> None:
    cfg = apply_overrides(base(), {"model.name": "pkg.mod:build", "data.kind": "tokens"})
    assert from_dict(WorkerConfig, cfg).model.name == "pkg.mod:build"


# ------------------------------------------------------------------------------------ overrides


def test_overrides_set_nested_values_and_parse_json() -> None:
    out = apply_overrides(
        base(),
        [
            "optim.lr=0.01",
            "train.early_stopping.patience=5",
            'data.features=["a", "b"]',
            "optim.grad_clip=null",
            "data.shuffle=false",
            "output.history_uri=/out/h.jsonl",
            "data.target = y",
        ],
    )
    assert out["optim"] == {"lr": 0.01, "grad_clip": None}
    assert out["train"] == {"early_stopping": {"patience": 5}}  # sections created on the way
    assert out["data"]["features"] == ["a", "b"]
    assert out["data"]["shuffle"] is False
    assert out["output"]["history_uri"] == "/out/h.jsonl"
    assert out["data"]["target"] == " y"  # key is stripped, the value is taken as written


def test_overrides_do_not_touch_the_input() -> None:
    data = base()
    apply_overrides(data, ["data.train_uri=/elsewhere"])
    assert data == base()


def test_override_replaces_a_null_section() -> None:
    data = {**base(), "train": {"early_stopping": None}}
    out = apply_overrides(data, ["train.early_stopping.patience=2"])
    assert out["train"]["early_stopping"] == {"patience": 2}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lr", "override must look like section.key=value, got 'optim.lr'"),
        ("=3", "override must look like section.key=value, got '=3'"),
        ("data.train_uri.x=1", "override data.train_uri.x: data.train_uri is not a section"),
    ],
    ids=["no-equals", "no-key", "into-a-value"],
)
def test_bad_overrides(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        apply_overrides(base(), [override])


# ------------------------------------------------------------------------------- load and dump


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(base()))
    return path


def test_load_worker_config_applies_overrides(config_file: Path) -> None:
    cfg = load_worker_config(str(config_file), ["train.epochs=2", "optim.lr=0.5"])
    assert cfg.train.epochs == 2 and cfg.optim.lr == 0.5
    assert cfg.data.train_uri == "/data/train.parquet"


def test_load_worker_config_rejects_a_bad_override(config_file: Path) -> None:
    with pytest.raises(ValueError, match=r"train\.epochs must be > 0, got 0 \(train\.epochs\)"):
        load_worker_config(str(config_file), ["train.epochs=0"])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("{not json", "config is not valid JSON"),
        ("[1, 2]", "config must hold a JSON object, got list"),
    ],
    ids=["invalid-json", "not-an-object"],
)
def test_load_worker_config_bad_file(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(body)
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        load_worker_config(str(path))
    assert str(path) in str(info.value)


def test_load_worker_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_worker_config(str(tmp_path / "nope.json"))


def full() -> WorkerConfig:
    data = apply_overrides(
        base(),
        {
            "data.features": ["a", "b"],
            "model.options": {"bias": False},
            "optim.grad_clip": None,
            "train.max_steps": 7,
            "train.early_stopping": {"metric": "val_accuracy", "mode": "max", "patience": 2},
            "checkpoint.uri": "/ckpt",
            "output.history_uri": "/h.jsonl",
            "dist.backend": "gloo",
        },
    )
    return from_dict(WorkerConfig, data)


def test_json_round_trip() -> None:
    cfg = full()
    assert from_dict(WorkerConfig, to_dict(cfg)) == cfg
    assert from_dict(WorkerConfig, json.loads(to_json(cfg))) == cfg


def test_config_hash_is_stable_and_sensitive() -> None:
    a, b = full(), full()
    assert config_hash(a) == config_hash(b)
    assert len(config_hash(a)) == 16
    assert config_hash(a) == config_hash(from_dict(WorkerConfig, json.loads(to_json(a))))
    changed = from_dict(WorkerConfig, apply_overrides(to_dict(a), {"optim.lr": 0.002}))
    assert config_hash(changed) != config_hash(a)
    nested = from_dict(
        WorkerConfig, apply_overrides(to_dict(a), {"train.early_stopping.patience": 3})
    )
    assert config_hash(nested) != config_hash(a)
