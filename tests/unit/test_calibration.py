"""Calibration (temperature scaling, and the share of the linear fit mixed in): the fits, the
model's buffers, its artifact and the training loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import safetensors.torch
import torch

from trainer.base.typedconfig import apply_overrides, from_dict
from trainer.config import ModelConfig, WorkerConfig
from trainer.distributed import dist
from trainer.models import ModelSpec, build_model
from trainer.models.export import load_model, predict, save_model
from trainer.training.calibration import (
    MIN_TEMPERATURE,
    fit_share,
    fit_temperature,
    mixed_loss,
    nll,
)
from trainer.training.loop import train

SPEC = ModelSpec(task="classification", in_features=4, num_classes=3)


def overconfident(n: int = 2000, scale: float = 4.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels drawn from softmax(z), and logits ``scale * z``: ``scale`` times too sure."""
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(n, 3, generator=gen) * 1.5
    labels = torch.multinomial(torch.softmax(z, -1), 1, generator=gen).squeeze(1)
    return z * scale, labels


def test_fit_finds_the_overconfidence_and_lowers_the_log_loss() -> None:
    logits, labels = overconfident(scale=4.0)
    temperature = fit_temperature(logits, labels)
    assert temperature == pytest.approx(4.0, rel=0.15)
    assert nll(logits, labels, temperature) < 0.8 * nll(logits, labels, 1.0)
    assert torch.equal((logits / temperature).argmax(-1), logits.argmax(-1))


@pytest.mark.parametrize(
    ("logits", "labels", "expected"),
    [
        (torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), 1.0),
        # every validation row right: the loss falls towards T -> 0; the fit stops at the bound
        (torch.tensor([[3.0, 0.0], [0.0, 3.0]]), torch.tensor([0, 1]), MIN_TEMPERATURE),
    ],
    ids=["no-rows", "all-right-stops-at-the-bound"],
)
def test_fit_edge_cases(logits: torch.Tensor, labels: torch.Tensor, expected: float) -> None:
    assert fit_temperature(logits, labels) == pytest.approx(expected)


def test_the_fit_is_deterministic() -> None:
    logits, labels = overconfident(scale=2.0)
    assert fit_temperature(logits, labels) == fit_temperature(logits.clone(), labels.clone())


@pytest.mark.parametrize("ensemble", [1, 4], ids=["one-mlp", "ensemble"])
def test_the_temperature_divides_the_logits_and_keeps_the_argmax(ensemble: int) -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="mlp", hidden_dim=8, ensemble=ensemble), SPEC).eval()
    x = torch.randn(16, 4)
    with torch.no_grad():
        raw = model(x)
        model.temperature.fill_(2.5)
        cooled = model(x)
    assert torch.allclose(cooled, raw / 2.5)
    assert torch.equal(cooled.argmax(-1), raw.argmax(-1))


def test_a_regression_model_has_no_temperature() -> None:
    model = build_model(ModelConfig(name="mlp"), ModelSpec(task="regression", in_features=4))
    assert "temperature" not in model.state_dict()


def _save(uri: str, model: torch.nn.Module, cfg: ModelConfig) -> None:
    save_model(uri, model, model_cfg=cfg, spec=SPEC, features=list("abcd"), target="y",
               schema=None, metrics={})  # fmt: skip


def test_the_temperature_survives_the_export_round_trip(tmp_path: Path) -> None:
    cfg = ModelConfig(name="mlp", hidden_dim=8)
    torch.manual_seed(1)
    model = build_model(cfg, SPEC).eval()
    model.temperature.fill_(3.0)
    _save(str(tmp_path / "model"), model, cfg)
    loaded = load_model(str(tmp_path / "model"))
    assert float(loaded.module.temperature) == 3.0
    x = torch.randn(8, 4)
    with torch.no_grad():
        assert torch.equal(predict(loaded, x), model(x))


def test_a_model_saved_before_calibration_loads_with_temperature_1(tmp_path: Path) -> None:
    cfg = ModelConfig(name="mlp", hidden_dim=8)
    torch.manual_seed(2)
    model = build_model(cfg, SPEC).eval()
    uri = tmp_path / "model"
    _save(str(uri), model, cfg)
    weights = safetensors.torch.load_file(str(uri / "model.safetensors"))
    del weights["temperature"]  # as written before the temperature existed
    safetensors.torch.save_file(weights, str(uri / "model.safetensors"))
    loaded = load_model(str(uri))
    assert float(loaded.module.temperature) == 1.0
    x = torch.randn(8, 4)
    with torch.no_grad():
        assert torch.equal(predict(loaded, x), model(x))


def test_the_share_goes_to_the_model_that_knows_the_labels() -> None:
    truth, labels = overconfident(scale=1.0)  # labels drawn from softmax(truth)
    noise = torch.randn(truth.shape, generator=torch.Generator().manual_seed(5)) * 2
    assert fit_share(noise, truth, labels, regression=False) > 0.9  # the linear model knows
    assert fit_share(truth, noise, labels, regression=False) < 0.1  # the network knows
    half = fit_share(truth + noise, truth - noise, labels, regression=False)
    assert 0.3 < half < 0.7  # each knows half: a mix beats both
    mixed = mixed_loss(truth + noise, truth - noise, labels, half, regression=False)
    assert mixed < min(nll(truth + noise, labels, 1.0), nll(truth - noise, labels, 1.0))


def test_a_validation_split_both_models_get_right_gives_an_even_mix() -> None:
    """A small table's 30 validation rows, all right with confidence for both: the log loss
    cannot tell the models apart, and the network, trained on, is the more certain one."""
    labels = torch.arange(30) % 3
    certain = torch.nn.functional.one_hot(labels, 3).float() * 20
    assert fit_share(certain, certain * 0.5, labels, regression=False) == pytest.approx(
        0.5, abs=0.05
    )


def test_the_regression_share_is_the_least_squares_mix() -> None:
    gen = torch.Generator().manual_seed(6)
    target = torch.randn(500, generator=gen)
    net = (target + torch.randn(500, generator=gen)).unsqueeze(1)
    linear = (target + 0.5 * torch.randn(500, generator=gen)).unsqueeze(1)
    share = fit_share(net, linear, target, regression=True)
    grid = torch.linspace(0, 1, 1001).tolist()
    best = min(grid, key=lambda v: mixed_loss(net, linear, target, v, regression=True))
    assert share == pytest.approx(best, abs=1e-3)
    assert 0.6 < share < 0.9  # the less noisy one gets the larger share
    assert fit_share(linear, linear, target, regression=True) == 0.0  # a tie keeps the network


@pytest.mark.parametrize(
    ("out", "anchor", "target", "regression", "expected"),
    [
        (torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), False, 0.0),
        (torch.zeros(0, 1), torch.zeros(0, 1), torch.zeros(0), True, 0.0),
        (torch.ones(4, 1), torch.full((4, 1), 5.0), torch.zeros(4), True, 0.0),  # worse: 0
        (torch.ones(4, 1), torch.zeros((4, 1)), torch.full((4,), -3.0), True, 1.0),  # past it
    ],
    ids=["no-rows", "no-rows-regression", "anchor-worse", "anchor-beyond-clipped"],
)
def test_fit_share_edge_cases(
    out: torch.Tensor, anchor: torch.Tensor, target: torch.Tensor, regression: bool, expected: float
) -> None:
    assert fit_share(out, anchor, target, regression) == expected


@pytest.mark.parametrize(
    ("task", "classes", "ensemble"),
    [("classification", 3, 1), ("classification", 3, 4), ("regression", None, 4)],
    ids=["classifier", "classifier-ensemble", "regressor-ensemble"],
)
def test_the_model_mixes_in_its_anchor_by_its_share(
    task: str, classes: int | None, ensemble: int
) -> None:
    spec = ModelSpec(task=task, in_features=4, num_classes=classes)
    torch.manual_seed(7)
    model = build_model(ModelConfig(name="mlp", hidden_dim=8, ensemble=ensemble), spec).eval()
    model.anchor_weight.normal_()
    model.anchor_bias.normal_()
    x = torch.randn(16, 4)
    with torch.no_grad():
        alone, linear = model(x), model.anchor(x)
        model.anchor_share.fill_(0.25)
        mixed = model(x)
    if task == "regression":
        assert torch.allclose(mixed, 0.75 * alone + 0.25 * linear, atol=1e-6)
    else:
        expected = 0.75 * torch.softmax(alone, -1) + 0.25 * torch.softmax(linear, -1)
        assert torch.allclose(torch.softmax(mixed, -1), expected, atol=1e-6)
        assert torch.allclose(mixed.exp().sum(-1), torch.ones(16), atol=1e-6)  # log probabilities


def test_the_anchor_starts_as_the_linear_fit_and_a_model_without_the_path_has_none() -> None:
    assert not hasattr(build_model(ModelConfig(name="mlp", linear="none"), SPEC), "anchor_weight")
    assert build_model(ModelConfig(name="mlp", linear="none"), SPEC).anchor_share is None
    assert "anchor_share" in build_model(ModelConfig(name="mlp"), SPEC).state_dict()


def test_the_anchor_survives_the_export_and_old_models_load_without_it(tmp_path: Path) -> None:
    cfg = ModelConfig(name="mlp", hidden_dim=8)
    torch.manual_seed(8)
    model = build_model(cfg, SPEC).eval()
    model.anchor_weight.normal_()
    model.anchor_share.fill_(0.4)
    _save(str(tmp_path / "model"), model, cfg)
    x = torch.randn(8, 4)
    loaded = load_model(str(tmp_path / "model"))
    assert float(loaded.module.anchor_share) == pytest.approx(0.4)
    with torch.no_grad():
        assert torch.equal(predict(loaded, x), model(x))
    weights = safetensors.torch.load_file(str(tmp_path / "model" / "model.safetensors"))
    for name in ("anchor_weight", "anchor_bias", "anchor_share"):  # as written before the anchor
        del weights[name]
    safetensors.torch.save_file(weights, str(tmp_path / "model" / "model.safetensors"))
    old = load_model(str(tmp_path / "model"))
    assert float(old.module.anchor_share) == 0.0
    model.anchor_share.fill_(0.0)
    with torch.no_grad():
        assert torch.equal(predict(old, x), model(x))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Noise with random labels (384 training rows, 128 validation rows): a model that learns
    the training rows is overconfident on the validation rows."""
    tmp = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(4)
    for name, rows in (("train", 384), ("val", 128)):
        cols = {f"f{i}": rng.standard_normal(rows).astype(np.float32) for i in range(4)}
        cols["label"] = rng.integers(0, 3, rows)
        pq.write_table(pa.table(cols), tmp / f"{name}.parquet")
    return str(tmp / "train.parquet"), str(tmp / "val.parquet")


def _cfg(tmp: Path, data: tuple[str, str], **overrides: Any) -> WorkerConfig:
    base = {
        "data": {"train_uri": data[0], "val_uri": data[1], "target": "label"},
        "model": {"name": "mlp", "hidden_dim": 32, "num_layers": 1, "ensemble": 2},
        "optim": {"lr": 3e-2, "weight_decay": 0.0},
        "train": {"epochs": 10, "global_batch_size": 64, "seed": 3},
        "checkpoint": {"uri": str(tmp / "ckpt"), "every_steps": 1000},
        "output": {"model_uri": str(tmp / "model")},
    }
    return from_dict(WorkerConfig, apply_overrides(base, overrides))


def test_training_exports_the_fitted_temperature_and_a_rerun_fits_the_same(
    tmp_path: Path, data: tuple[str, str], ctx: dist.DistContext
) -> None:
    cfg = _cfg(tmp_path, data)
    result = train(cfg, ctx)
    metrics = json.loads((tmp_path / "model" / "metrics.json").read_text())
    weights = safetensors.torch.load_file(str(tmp_path / "model" / "model.safetensors"))
    assert float(weights["temperature"]) == pytest.approx(metrics["temperature"])
    assert metrics["temperature"] > 1.5  # noise: the overfitted model is far too sure
    assert float(weights["anchor_share"]) == pytest.approx(metrics["linear_share"])
    assert metrics["val_loss_calibrated"] <= metrics["val_loss"] + 1e-9
    assert result.metrics == pytest.approx(metrics)
    again = train(cfg, ctx)  # resumes at the last checkpoint and exports again
    assert again.resumed_from == result.steps
    rerun = safetensors.torch.load_file(str(tmp_path / "model" / "model.safetensors"))
    for k, v in weights.items():
        assert torch.equal(v, rerun[k]), k


def test_calibrate_false_keeps_temperature_1(
    tmp_path: Path, data: tuple[str, str], ctx: dist.DistContext
) -> None:
    train(_cfg(tmp_path, data, **{"train.calibrate": False}), ctx)
    metrics = json.loads((tmp_path / "model" / "metrics.json").read_text())
    weights = safetensors.torch.load_file(str(tmp_path / "model" / "model.safetensors"))
    assert "temperature" not in metrics and float(weights["temperature"]) == 1.0
    assert "linear_share" not in metrics and float(weights["anchor_share"]) == 0.0


@pytest.fixture(scope="module")
def linear_table(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A small regression table whose target is linear in its features plus noise (96 training
    rows): the network fits some of the training rows' noise, the linear fit cannot."""
    tmp = tmp_path_factory.mktemp("linear")
    rng = np.random.default_rng(9)
    w = rng.standard_normal(6)
    for name, rows in (("train", 96), ("val", 96)):
        x = rng.standard_normal((rows, 6)).astype(np.float32)
        cols = {f"f{i}": x[:, i] for i in range(6)}
        cols["y"] = (x @ w + rng.standard_normal(rows)).astype(np.float32)
        pq.write_table(pa.table(cols), tmp / f"{name}.parquet")
    return str(tmp / "train.parquet"), str(tmp / "val.parquet")


@pytest.mark.parametrize("calibrate", [True, False], ids=["calibrated", "off"])
def test_a_regressor_exports_its_share_of_the_linear_fit(
    tmp_path: Path, linear_table: tuple[str, str], ctx: dist.DistContext, calibrate: bool
) -> None:
    cfg = _cfg(tmp_path, linear_table, **{
        "data.target": "y", "data.task": "regression", "model.hidden_dim": 128,
        "train.epochs": 40, "train.global_batch_size": 16, "train.calibrate": calibrate,
    })  # fmt: skip
    train(cfg, ctx)
    metrics = json.loads((tmp_path / "model" / "metrics.json").read_text())
    weights = safetensors.torch.load_file(str(tmp_path / "model" / "model.safetensors"))
    if not calibrate:
        assert "linear_share" not in metrics and float(weights["anchor_share"]) == 0.0
        return
    assert float(weights["anchor_share"]) == pytest.approx(metrics["linear_share"])
    assert metrics["linear_share"] > 0.2  # the overfitted network leans on the linear fit
    assert metrics["val_loss_calibrated"] < metrics["val_loss"]
    # The exported model scores the validation rows as the fit said.
    val = pq.read_table(linear_table[1]).to_pandas()
    loaded = load_model(str(tmp_path / "model"))
    pred = predict(loaded, torch.tensor(val[[f"f{i}" for i in range(6)]].to_numpy()))
    mse = float(((pred.numpy() - val["y"].to_numpy()) ** 2).mean())
    scale = loaded.meta["target_scale"]["std"] if loaded.meta.get("target_scale") else 1.0
    assert mse == pytest.approx(metrics["val_loss_calibrated"] * scale**2, rel=1e-3)
