"""The MLP's linear path: the closed-form fit matches scikit-learn, and training starts from it."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from sklearn.datasets import make_classification, make_regression
from sklearn.linear_model import LogisticRegression, Ridge

from trainer.base.typedconfig import from_dict
from trainer.config import ModelConfig, WorkerConfig
from trainer.distributed import dist
from trainer.models import ModelSpec, TabularMLP, build_model, export, linear_fit
from trainer.models.linear_fit import fit_linear, fit_rows
from trainer.training import loop


def _xy(task: str, rows: int = 400, classes: int = 3, seed: int = 0) -> tuple[Any, Any]:
    if task == "regression":
        x, y = make_regression(n_samples=rows, n_features=6, noise=5.0, random_state=seed)
        return x, (y - y.mean()) / y.std()
    x, y = make_classification(
        n_samples=rows, n_features=6, n_informative=4, n_classes=classes, random_state=seed
    )
    return x, y


def test_the_ridge_fit_is_scikit_learns_ridge() -> None:
    x, y = _xy("regression")
    fit = fit_linear(torch.tensor(x, dtype=torch.float32), torch.tensor(y), task="regression")
    assert fit is not None and fit.rows == 400
    ref = Ridge(alpha=1.0).fit(x.astype(np.float32).astype(np.float64), y)
    np.testing.assert_allclose(fit.weight[0].numpy(), ref.coef_, rtol=1e-6, atol=1e-9)
    assert fit.bias.item() == pytest.approx(ref.intercept_, abs=1e-9)


@pytest.mark.parametrize("classes", [2, 3], ids=["binary", "three-classes"])
def test_the_logistic_fit_predicts_as_scikit_learns(classes: int) -> None:
    x, y = _xy("classification", classes=classes)
    x32 = x.astype(np.float32)
    fit = fit_linear(torch.tensor(x32), torch.tensor(y), task="classification", num_classes=classes)
    assert fit is not None and fit.weight.shape == (classes, 6)
    ours = torch.softmax(torch.tensor(x32, dtype=torch.float64) @ fit.weight.T + fit.bias, -1)
    ref = LogisticRegression(C=1.0, max_iter=5000, tol=1e-10).fit(x32.astype(np.float64), y)
    np.testing.assert_allclose(ours.numpy(), ref.predict_proba(x32.astype(np.float64)), atol=1e-4)


def test_a_large_table_is_fitted_on_evenly_strided_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fit_rows(1000, 10) is None  # within the budget: every row
    monkeypatch.setattr(linear_fit, "MAX_FIT_ELEMENTS", 1000)
    rows = fit_rows(1000, 10)
    assert rows is not None and rows.tolist() == list(range(0, 1000, 10))
    x, y = _xy("regression", rows=1000)  # 6 features: 166 rows fit the budget, every 7th is read
    fit = fit_linear(torch.tensor(x), torch.tensor(y), task="regression")
    assert fit is not None and fit.rows == len(range(0, 1000, 7))


def test_a_table_too_wide_to_fit_is_left_unfitted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(linear_fit, "MAX_FIT_FEATURES", 5)
    x, y = _xy("regression")
    with caplog.at_level(logging.INFO, logger="trainer.models.linear_fit"):
        assert fit_linear(torch.tensor(x), torch.tensor(y), task="regression") is None
    assert "6 features" in caplog.text


@pytest.mark.parametrize("layers", [0, 2], ids=["linear-model", "mlp"])
def test_the_model_starts_as_the_linear_fit(layers: int) -> None:
    x, y = _xy("classification")
    xt = torch.tensor(x, dtype=torch.float32)
    fit = fit_linear(xt, torch.tensor(y), task="classification", num_classes=3)
    assert fit is not None
    torch.manual_seed(0)
    model = TabularMLP(6, 3, hidden_dim=8, num_layers=layers, linear=True)
    assert (model.linear is None) == (layers == 0)  # no second linear map on a linear model
    model.start_from_linear(fit)
    expected = (xt.double() @ fit.weight.T + fit.bias).float()
    torch.testing.assert_close(model(xt), expected, rtol=1e-5, atol=1e-5)
    assert all(p.requires_grad for p in model.parameters())  # training may move every weight
    if layers:  # the MLP keeps the fit apart (buffers, never trained) for calibration's mix
        torch.testing.assert_close(model.anchor(xt), expected, rtol=1e-5, atol=1e-5)
        assert "anchor_weight" not in dict(model.named_parameters())


def test_a_plain_mlp_has_no_linear_path() -> None:
    spec = ModelSpec(task="regression", in_features=4)
    plain = build_model(ModelConfig(linear="none"), spec)
    wide = build_model(ModelConfig(), spec)
    assert "linear.weight" not in plain.state_dict()
    assert set(wide.state_dict()) - set(plain.state_dict()) == {
        "linear.weight", "linear.bias",
        "anchor_weight", "anchor_bias", "anchor_share",  # the fit kept apart, and its share
    }  # fmt: skip


def _config(tmp: Path, linear: str, **train: Any) -> WorkerConfig:
    """A linear regression table with noise: training rows 0-299, validation rows 300-399."""
    x, y = _xy("regression", rows=400, seed=3)
    cols: dict[str, Any] = {f"f{i}": x[:, i].astype(np.float32) for i in range(6)}
    cols["y"] = y.astype(np.float32)
    table = pa.table(cols)
    pq.write_table(table.slice(0, 300), tmp / "train.parquet")
    pq.write_table(table.slice(300), tmp / "val.parquet")
    return from_dict(
        WorkerConfig,
        {
            "data": {
                "train_uri": str(tmp / "train.parquet"),
                "val_uri": str(tmp / "val.parquet"),
                "target": "y",
                "task": "regression",
            },
            "model": {"linear": linear, "hidden_dim": 64},
            "optim": {"lr": 3e-3, "warmup_steps": 0},
            "train": {"epochs": 40, "global_batch_size": 32, "seed": 1, **train},
            "output": {"model_uri": str(tmp / "model"), "history_uri": str(tmp / "h.jsonl")},
        },
    )


def _evals(tmp: Path) -> list[dict[str, Any]]:
    lines = (tmp / "h.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == "eval"]


def test_early_stopping_never_ends_worse_than_the_linear_start(
    tmp_path: Path, ctx: dist.DistContext
) -> None:
    es = {"metric": "val_loss", "patience": 3}
    result = loop.train(_config(tmp_path, "fit", early_stopping=es), ctx)
    evals = _evals(tmp_path)
    assert evals[0]["step"] == 0  # the starting weights are scored too
    x, y = _xy("regression", rows=400, seed=3)
    ridge = Ridge(alpha=1.0).fit(x[:300].astype(np.float32).astype(np.float64), y[:300])
    ridge_rmse = float(np.sqrt(np.mean((ridge.predict(x[300:].astype(np.float32)) - y[300:]) ** 2)))
    assert evals[0]["val_rmse"] == pytest.approx(ridge_rmse, rel=1e-3)  # it starts as Ridge
    best = min(e["val_loss"] for e in evals)
    assert result.metrics["val_loss"] == pytest.approx(best, rel=1e-3)  # history rounds
    assert result.metrics["val_rmse"] <= evals[0]["val_rmse"] + 1e-6
    loaded = export.load_model(str(tmp_path / "model"))
    assert loaded.model_cfg.linear == "fit" and "linear.weight" in loaded.module.state_dict()


def test_a_plain_mlp_starts_from_random_weights(tmp_path: Path, ctx: dist.DistContext) -> None:
    es = {"metric": "val_loss", "patience": 3}
    loop.train(_config(tmp_path, "none", early_stopping=es, epochs=2), ctx)
    evals = _evals(tmp_path)
    assert evals[0]["step"] == 0 and evals[0]["val_rmse"] > 0.5  # far from the linear fit
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]


def test_a_model_saved_before_the_linear_path_loads_as_a_plain_mlp(
    tmp_path: Path, ctx: dist.DistContext
) -> None:
    loop.train(_config(tmp_path, "none", epochs=1), ctx)
    meta_path = tmp_path / "model" / "model.json"
    meta = json.loads(meta_path.read_text())
    del meta["model"]["linear"]  # as written before model.linear existed
    meta_path.write_text(json.dumps(meta))
    loaded = export.load_model(str(tmp_path / "model"))
    assert loaded.model_cfg.linear == "none"
    assert loaded.module(torch.zeros(2, 6)).shape == (2, 1)
