"""The training loop in one process: schedule, optimizer groups, a full run and its outcomes."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from trainer.base.typedconfig import apply_overrides, from_dict
from trainer.checkpoint.manager import CheckpointManager
from trainer.config import ModelConfig, WorkerConfig
from trainer.demo import make_table
from trainer.distributed import dist
from trainer.models import ModelSpec, build_model
from trainer.training.loop import train
from trainer.training.optim import lr_multiplier, make_optimizer
from trainer.training.stop import Preempted, StopSignal

# ---------------------------------------------------------------------------------- schedule


@pytest.mark.parametrize(
    ("step", "kw", "expected"),
    [
        (0, dict(total=100, warmup=10, schedule="cosine", min_ratio=0.1), 0.1),
        (4, dict(total=100, warmup=10, schedule="cosine", min_ratio=0.1), 0.5),
        (9, dict(total=100, warmup=10, schedule="cosine", min_ratio=0.1), 1.0),
        (10, dict(total=100, warmup=10, schedule="cosine", min_ratio=0.1), 1.0),
        (55, dict(total=100, warmup=10, schedule="cosine", min_ratio=0.1), 0.55),
        (100, dict(total=100, warmup=10, schedule="cosine", min_ratio=0.1), 0.1),
        (500, dict(total=100, warmup=10, schedule="cosine", min_ratio=0.1), 0.1),
        (0, dict(total=100, warmup=0, schedule="cosine", min_ratio=0.0), 1.0),
        (100, dict(total=100, warmup=0, schedule="cosine", min_ratio=0.0), 0.0),
        (50, dict(total=100, warmup=0, schedule="linear", min_ratio=0.0), 0.5),
        (100, dict(total=100, warmup=0, schedule="linear", min_ratio=0.2), 0.2),
        (25, dict(total=100, warmup=0, schedule="linear", min_ratio=0.2), 0.8),
        (0, dict(total=100, warmup=0, schedule="constant", min_ratio=0.1), 1.0),
        (99, dict(total=100, warmup=0, schedule="constant", min_ratio=0.1), 1.0),
        (1, dict(total=100, warmup=4, schedule="constant", min_ratio=0.1), 0.5),
        (5, dict(total=3, warmup=3, schedule="cosine", min_ratio=0.1), 1.0),
        (50, dict(total=100, warmup=0, schedule="cosine", min_ratio=1.0), 1.0),
    ],
    ids=[
        "warmup-first",
        "warmup-mid",
        "warmup-last",
        "peak-after-warmup",
        "cosine-mid",
        "cosine-end",
        "past-end-stays-at-min",
        "cosine-start-no-warmup",
        "cosine-end-zero-min",
        "linear-mid",
        "linear-end-min",
        "linear-quarter",
        "constant-start",
        "constant-end",
        "constant-warms-up",
        "all-warmup",
        "min-ratio-1-is-flat",
    ],
)
def test_lr_multiplier(step: int, kw: dict[str, Any], expected: float) -> None:
    assert lr_multiplier(step, **kw) == pytest.approx(expected, abs=1e-9)


def test_cosine_decays_monotonically() -> None:
    values = [
        lr_multiplier(s, total=50, warmup=5, schedule="cosine", min_ratio=0.1) for s in range(5, 51)
    ]
    assert all(a >= b for a, b in itertools.pairwise(values))
    assert values[0] == 1.0 and values[-1] == pytest.approx(0.1)


# --------------------------------------------------------------------------------- optimizer


def worker_cfg(**overrides: Any) -> WorkerConfig:
    data = {
        "data": {"train_uri": "/unused.parquet"},
        "output": {"model_uri": "/unused"},
        "optim": {"weight_decay": 0.05},
    }
    return from_dict(WorkerConfig, apply_overrides(data, overrides))


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("mlp", ModelSpec(task="classification", in_features=4, num_classes=3)),
        ("gpt", ModelSpec(task="lm", seq_len=8)),
    ],
    ids=["mlp", "gpt"],
)
def test_weight_decay_only_on_matrices(name: str, spec: ModelSpec) -> None:
    model_cfg = ModelConfig(name=name, hidden_dim=8, vocab_size=64, n_layer=1, n_head=2, d_model=16)
    model = build_model(model_cfg, spec)
    opt = make_optimizer(model, worker_cfg(), torch.device("cpu"))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert decay["params"] and all(p.dim() >= 2 for p in decay["params"])
    assert no_decay["params"] and all(p.dim() < 2 for p in no_decay["params"])
    one_d = {id(p) for p in model.parameters() if p.dim() < 2}  # biases and norm weights
    assert {id(p) for p in no_decay["params"]} == one_d
    grouped = {id(p) for g in opt.param_groups for p in g["params"]}
    assert grouped == {id(p) for p in model.parameters()}  # tied weights counted once


@pytest.mark.parametrize(
    ("fused", "expected"),
    [(None, False), (False, False), (True, True)],
    ids=["default-off-on-cpu", "off", "on"],
)
def test_fused_flag(fused: bool | None, expected: bool) -> None:
    model = torch.nn.Linear(3, 2)
    opt = make_optimizer(model, worker_cfg(**{"optim.fused": fused}), torch.device("cpu"))
    assert bool(opt.defaults["fused"]) is expected


def test_frozen_parameters_are_left_out() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    for p in model[0].parameters():
        p.requires_grad_(False)
    opt = make_optimizer(model, worker_cfg(), torch.device("cpu"))
    assert sum(len(g["params"]) for g in opt.param_groups) == 2


# --------------------------------------------------------------------------------- full runs


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A small learnable classification table: 512 training rows, 256 validation rows."""
    tmp = tmp_path_factory.mktemp("data")
    table = make_table(768, features=6, classes=3, seed=1)
    train_uri, val_uri = tmp / "train.parquet", tmp / "val.parquet"
    pq.write_table(table.slice(0, 512), train_uri)
    pq.write_table(table.slice(512), val_uri)
    return str(train_uri), str(val_uri)


@pytest.fixture(scope="module")
def noise(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Pure-noise features with random labels: nothing to learn."""
    tmp = tmp_path_factory.mktemp("noise")
    rng = np.random.default_rng(3)
    uris = []
    for name, rows in (("train", 512), ("val", 256)):
        cols = {f"f{i}": rng.standard_normal(rows).astype(np.float32) for i in range(4)}
        cols["label"] = rng.integers(0, 2, rows)
        path = tmp / f"{name}.parquet"
        pq.write_table(pa.table(cols), path)
        uris.append(str(path))
    return uris[0], uris[1]


def run_cfg(tmp: Path, data: tuple[str, str], **overrides: Any) -> WorkerConfig:
    base = {
        "data": {"train_uri": data[0], "val_uri": data[1], "target": "label"},
        # Random starting weights, so a loss visibly falls; the default start from the linear
        # fit (model.linear) is tested in test_linear_fit.py.
        "model": {"name": "mlp", "hidden_dim": 16, "num_layers": 1, "linear": "none"},
        "optim": {"lr": 1e-2, "warmup_steps": 2},
        "train": {"epochs": 3, "global_batch_size": 64, "log_every_steps": 4, "seed": 5},
        "checkpoint": {"uri": str(tmp / "ckpt"), "every_steps": 1000, "keep_last": 5},
        "output": {"model_uri": str(tmp / "model"), "history_uri": str(tmp / "history.jsonl")},
    }
    return from_dict(WorkerConfig, apply_overrides(base, overrides))


def history(tmp: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp / "history.jsonl").read_text().splitlines()]


def test_train_writes_model_metrics_and_history(
    tmp_path: Path, data: tuple[str, str], ctx: dist.DistContext
) -> None:
    result = train(run_cfg(tmp_path, data), ctx)
    model = tmp_path / "model"
    assert {"model.safetensors", "model.json", "metrics.json"} <= {p.name for p in model.iterdir()}
    metrics = json.loads((model / "metrics.json").read_text())
    assert {"train_loss", "val_loss", "val_accuracy"} <= set(metrics)
    assert metrics["val_accuracy"] > 0.6 and metrics == pytest.approx(result.metrics)
    assert result.steps == 24 and not result.stopped_early and result.resumed_from is None

    events = [r["event"] for r in history(tmp_path)]
    assert events[0] == "start" and events[-1] == "done"
    # step 0 checkpoint, then per epoch: step lines, eval, end-of-epoch checkpoint
    assert events[1] == "checkpoint"
    body = events[2:-1]
    for _ in range(3):
        first_eval = body.index("eval")
        assert set(body[:first_eval]) == {"step"}
        assert body[first_eval + 1] == "checkpoint"
        body = body[first_eval + 2 :]
    assert body == []
    steps = [r for r in history(tmp_path) if r["event"] == "step"]
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert all(r["job"] == "local" for r in history(tmp_path))


def test_max_steps_is_respected(
    tmp_path: Path, data: tuple[str, str], ctx: dist.DistContext
) -> None:
    result = train(run_cfg(tmp_path, data, **{"train.max_steps": 5}), ctx)
    h = history(tmp_path)
    assert result.steps == 5
    assert h[0]["total_steps"] == 5
    assert max(r["step"] for r in h if r["event"] == "step") == 5
    assert h[-1]["event"] == "done" and h[-1]["step"] == 5
    assert [r["step"] for r in h if r["event"] == "eval"] == [5]  # final evaluation


def test_early_stopping_keeps_the_best_weights(
    tmp_path: Path, noise: tuple[str, str], ctx: dist.DistContext
) -> None:
    # A min_delta no evaluation can beat: the first evaluation (of the starting weights, at
    # step 0) stays the best one.
    cfg = run_cfg(
        tmp_path,
        noise,
        **{
            "train.epochs": 5,
            "train.early_stopping": {"metric": "val_loss", "patience": 2, "min_delta": 10.0},
        },
    )
    result = train(cfg, ctx)
    steps_per_epoch = 512 // 64
    assert result.stopped_early and result.steps == 2 * steps_per_epoch < 5 * steps_per_epoch
    h = history(tmp_path)
    evals = [r for r in h if r["event"] == "eval"]
    assert [r["step"] for r in evals] == [0, steps_per_epoch, 2 * steps_per_epoch]
    stop = next(r for r in h if r["event"] == "early_stop")
    assert stop["best"] == pytest.approx(evals[0]["val_loss"])
    metrics = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert metrics["val_loss"] == pytest.approx(evals[0]["val_loss"])

    exported = load_file(str(tmp_path / "model" / "model.safetensors"))
    ckpt = CheckpointManager(str(tmp_path / "ckpt"), keep_last=5)
    best = ckpt.load(0)["model"]
    last = ckpt.load(2 * steps_per_epoch)["model"]
    exported.pop("temperature")  # fitted after training (test_calibration.py): 1 in checkpoints
    for k, v in exported.items():
        assert torch.equal(v, best[k]), k
    assert any(not torch.equal(v, last[k]) for k, v in exported.items())


def test_rerunning_an_early_stopped_run_keeps_the_best_weights(
    tmp_path: Path, noise: tuple[str, str], ctx: dist.DistContext
) -> None:
    es = {"metric": "val_loss", "patience": 1, "min_delta": 10.0}
    cfg = run_cfg(tmp_path, noise, **{"train.epochs": 5, "train.early_stopping": es})
    first = train(cfg, ctx)
    before = load_file(str(tmp_path / "model" / "model.safetensors"))
    again = train(cfg, ctx)  # e.g. a retried pod after the run had finished
    after = load_file(str(tmp_path / "model" / "model.safetensors"))
    assert again.steps == first.steps
    for k in before:
        assert torch.equal(before[k], after[k]), k


def test_resuming_a_finished_run_just_re_exports(
    tmp_path: Path, data: tuple[str, str], ctx: dist.DistContext
) -> None:
    cfg = run_cfg(tmp_path, data, **{"train.epochs": 1})
    train(cfg, ctx)
    first = load_file(str(tmp_path / "model" / "model.safetensors"))
    (tmp_path / "model" / "model.safetensors").unlink()
    again = train(cfg, ctx)
    assert again.resumed_from == 8 and again.steps == 8
    events = [r["event"] for r in history(tmp_path)]
    # the first attempt's history is kept; the rerun only restores, starts and exports
    assert events[-3:] == ["restore", "start", "done"]
    assert events.count("step") == 2 and events.count("done") == 1
    second = load_file(str(tmp_path / "model" / "model.safetensors"))
    for k in first:
        assert torch.equal(first[k], second[k]), k


def test_resuming_a_finished_run_keeps_its_metrics(
    tmp_path: Path, data: tuple[str, str], ctx: dist.DistContext
) -> None:
    cfg = run_cfg(tmp_path, data, **{"train.epochs": 1})
    train(cfg, ctx)
    before = json.loads((tmp_path / "model" / "metrics.json").read_text())
    train(cfg, ctx)
    after = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert "val_accuracy" in after and after == pytest.approx(before)


def test_stop_requested_preempts_after_one_step_with_a_checkpoint(
    tmp_path: Path, data: tuple[str, str], ctx: dist.DistContext
) -> None:
    stop = StopSignal()
    stop.requested.set()
    with pytest.raises(Preempted) as info:
        train(run_cfg(tmp_path, data), ctx, stop)
    assert info.value.step == 1
    assert info.value.checkpoint is not None and info.value.checkpoint.endswith("step-00000001")
    ckpt = CheckpointManager(str(tmp_path / "ckpt"), keep_last=5)
    assert ckpt.steps() == [0, 1]
    state = ckpt.load(1)  # verifies the checksums
    assert state["meta"]["step"] == 1 and state["data"]["step"] == 1
    assert not (tmp_path / "model").exists()
    assert [r["event"] for r in history(tmp_path)][-2:] == ["step", "checkpoint"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"data.target": "y"}, "target column 'y' not found"),
        ({"data.features": ["f0", "nope"]}, "feature column 'nope' not found"),
        ({"train.global_batch_size": 1024}, "fewer than one global batch of 1024"),
        ({"data.train_uri": "/no/such/dir/train.parquet"}, "/no/such/dir/train.parquet"),
        ({"train.early_stopping": {"metric": "val_rmse"}}, "'val_rmse' is not produced"),
    ],
    ids=[
        "missing-target",
        "missing-feature",
        "batch-bigger-than-data",
        "missing-file",
        "metric-not-produced",
    ],
)
def test_bad_data_is_a_value_error_naming_it(
    tmp_path: Path,
    data: tuple[str, str],
    ctx: dist.DistContext,
    overrides: dict[str, Any],
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as info:
        train(run_cfg(tmp_path, data, **overrides), ctx)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "model").exists()


def test_loss_that_is_nan_from_the_start_fails_without_checkpoints(
    tmp_path: Path, data: tuple[str, str], ctx: dist.DistContext
) -> None:
    cfg = run_cfg(tmp_path, data, **{"optim.lr": 1e30, "checkpoint.uri": None})
    with pytest.raises(RuntimeError, match=r"checkpoint\.uri is not set"):
        train(cfg, ctx)
    assert not (tmp_path / "model").exists()


def test_stop_without_checkpoints_still_stops_after_one_step(
    tmp_path: Path, data: tuple[str, str], ctx: dist.DistContext
) -> None:
    stop = StopSignal()
    stop.requested.set()
    cfg = run_cfg(tmp_path, data, **{"checkpoint.uri": None, "train.log_every_steps": 1000})
    with pytest.raises(Preempted) as info:
        train(cfg, ctx, stop)
    assert info.value.step == 1 and info.value.checkpoint is None


def test_piecewise_bins_are_cut_at_the_training_rows_and_exported(
    tmp_path: Path, data: tuple[str, str], ctx: dist.DistContext
) -> None:
    cfg = run_cfg(tmp_path, data, **{"train.epochs": 1, "model.embedding": "periodic+ple"})
    train(cfg, ctx)
    edges = load_file(str(tmp_path / "model" / "model.safetensors"))["embed.piecewise.edges"]
    table = pq.read_table(data[0]).drop(["label"])
    lowest = [float(np.min(table[name].to_numpy())) for name in table.column_names]
    highest = [float(np.max(table[name].to_numpy())) for name in table.column_names]
    assert edges[:, 0].tolist() == pytest.approx(lowest)
    assert edges[:, -1].tolist() == pytest.approx(highest)
