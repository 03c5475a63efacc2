"""Temperature scaling: the fit, the model's temperature, its artifact and the training loop."""

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
from trainer.training.calibration import MIN_TEMPERATURE, fit_temperature, nll
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
