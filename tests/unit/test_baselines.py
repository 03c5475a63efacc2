"""Baselines on the same split, a gate that cannot pass garbage, and regression's target scale."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from sklearn import metrics as skm
from sklearn.linear_model import LogisticRegression, Ridge

from trainer.base.errors import InputError
from trainer.base.typedconfig import from_dict
from trainer.config import ModelConfig
from trainer.models import ModelSpec, build_model
from trainer.models.export import load_model, predict, save_model
from trainer.steps.evaluate import EvaluateConfig, GateConfig, decide_gate, evaluate

FEATURES = ["f0", "f1", "f2", "f3"]
LINEAR = ModelConfig(name="mlp", num_layers=0)


def table(task: str, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features, target and the true linear weights (regression targets around 300,000)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, len(FEATURES))).astype(np.float32)
    w = np.random.default_rng(99).standard_normal((len(FEATURES), 3 if task != "regression" else 1))
    if task == "classification":
        y = (x @ w + 0.5 * rng.standard_normal((rows, 3))).argmax(axis=1).astype(np.int64)
    else:
        y = (300_000 + 50_000 * (x @ w)[:, 0] + 500 * rng.standard_normal(rows)).astype(np.float32)
    return x, y, w.astype(np.float32)


def write_dataset(root: Path, task: str) -> tuple[str, np.ndarray]:
    """train.parquet and test.parquet of one linear problem; returns the dir and the weights."""
    root.mkdir(parents=True)
    for split, rows, seed in (("train", 800, 1), ("test", 300, 2)):
        x, y, w = table(task, rows, seed)
        cols: dict[str, Any] = {f: x[:, i] for i, f in enumerate(FEATURES)}
        cols["label"] = y
        pq.write_table(pa.table(cols), root / f"{split}.parquet")
    (root / "schema.json").write_text(json.dumps({"task": task, "classes": None}))
    return str(root), w


def write_linear_model(
    uri: Path, task: str, weights: np.ndarray, *, skill: float, scale: list[float] | None = None
) -> str:
    """A linear model with weights ``skill * weights`` (negative: worse than knowing nothing)."""
    k = weights.shape[1]
    spec = ModelSpec(task=task, in_features=len(FEATURES),  # type: ignore[arg-type]
                     num_classes=k if task == "classification" else None)  # fmt: skip
    model = build_model(LINEAR, spec)
    with torch.no_grad():
        model.head.weight.copy_(torch.from_numpy(skill * weights.T))
        model.head.bias.zero_()
    save_model(str(uri), model, model_cfg=LINEAR, spec=spec, features=FEATURES, target="label",
               schema=None, metrics={}, target_scale=scale)  # fmt: skip
    return str(uri)


def split_arrays(data: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    t = pq.read_table(Path(data) / f"{split}.parquet")
    return np.column_stack([t[f].to_numpy() for f in FEATURES]), t["label"].to_numpy()


def run_evaluate(tmp_path: Path, model: str, data: str, **gate: Any):
    cfg = from_dict(EvaluateConfig, {"gate": gate})
    return evaluate(cfg, model_uri=model, dataset_uri=data, report_uri=str(tmp_path / "r.html"))


# --- the gate ---------------------------------------------------------------------------------

BASELINES = {
    "trivial": ("training mean", 100.0),
    "linear": ("ridge regression", 40.0),
    "hgb": ("histogram gradient boosting", 30.0),
}


@pytest.mark.parametrize(
    ("value", "rule", "passed", "clause"),
    [
        (120.0, "trivial", False, "is worse than the trivial predictor (training mean, rmse 100)"),
        (100.0, "trivial", True, "no worse than the trivial predictor (training mean, rmse 100)"),
        (50.0, "trivial", True, "is no worse than the trivial predictor (training mean, rmse 100)"),
        (50.0, "best", False, "does not beat the best baseline, hgb (histogram gradient "
                              "boosting, rmse 30)"),
        (30.0, "best", False, "does not beat the best baseline, hgb"),
        (29.0, "best", True, "beats the best baseline, hgb (histogram gradient boosting, rmse 30)"),
    ],
    ids=["worse-than-trivial", "ties-trivial", "beats-trivial", "worse-than-best", "ties-best",
         "beats-best"],
)  # fmt: skip
def test_gate_compares_with_the_baselines_and_says_which(
    value: float, rule: str, passed: bool, clause: str
) -> None:
    ok, reason = decide_gate(
        metric="rmse", value=value, threshold=None, min_improvement=0.0, has_champion=False,
        champion_value=None, baselines=BASELINES, baseline=rule,
    )  # fmt: skip
    assert ok is passed
    assert clause in reason
    assert reason.startswith(f"rmse {value:.4g} (no threshold) and ")


def test_a_threshold_does_not_rescue_a_model_worse_than_trivial() -> None:
    ok, reason = decide_gate(
        metric="accuracy", value=0.5, threshold=0.4, min_improvement=0.0, has_champion=False,
        champion_value=None, baselines={"trivial": ("majority class", 0.6)},
    )  # fmt: skip
    assert not ok
    assert reason == (
        "accuracy 0.5 >= threshold 0.4 and is worse than the trivial predictor "
        "(majority class, accuracy 0.6) and no champion to beat"
    )


def test_gate_baseline_must_be_known() -> None:
    with pytest.raises(InputError, match=r"gate.baseline must be 'trivial' or 'best', got 'x'"):
        GateConfig(baseline="x")  # type: ignore[arg-type]


# --- evaluate: baselines on the same split ------------------------------------------------------


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_baselines_are_fitted_on_train_and_scored_on_the_same_test_rows(
    tmp_path: Path, task: str
) -> None:
    data, w = write_dataset(tmp_path / "ds", task)
    scale = [300_000.0, 50_000.0] if task == "regression" else None
    model = write_linear_model(tmp_path / "m", task, w, skill=1.0, scale=scale)
    result = run_evaluate(tmp_path, model, data)
    assert list(result.baselines) == ["trivial", "linear", "hgb"]
    x_tr, y_tr = split_arrays(data, "train")
    x_te, y_te = split_arrays(data, "test")
    if task == "classification":
        expected = LogisticRegression(max_iter=1000).fit(x_tr, y_tr).score(x_te, y_te)
        assert result.baselines["linear"]["accuracy"] == pytest.approx(expected)
        majority = np.bincount(y_tr).argmax()
        assert result.baselines["trivial"]["accuracy"] == pytest.approx(np.mean(y_te == majority))
    else:
        pred = Ridge().fit(x_tr, y_tr).predict(x_te)
        rmse = math.sqrt(skm.mean_squared_error(y_te, pred))
        assert result.baselines["linear"]["rmse"] == pytest.approx(rmse, rel=1e-4)
        trivial = math.sqrt(skm.mean_squared_error(y_te, np.full_like(y_te, y_tr.mean())))
        assert result.baselines["trivial"]["rmse"] == pytest.approx(trivial, rel=1e-4)
    assert result.gate_passed, result.gate_reason
    html = (tmp_path / "r.html").read_text()
    assert "baseline: linear" in html and "baseline: hgb" in html


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_a_model_worse_than_the_trivial_predictor_never_passes(tmp_path: Path, task: str) -> None:
    data, w = write_dataset(tmp_path / "ds", task)
    scale = [300_000.0, 50_000.0] if task == "regression" else None
    model = write_linear_model(tmp_path / "m", task, w, skill=-1.0, scale=scale)
    result = run_evaluate(tmp_path, model, data)  # no threshold, no champion
    assert not result.gate_passed
    assert "is worse than the trivial predictor" in result.gate_reason
    if task == "regression":  # what it predicts, with its value, then its score (issue 39)
        mean = float(pq.read_table(f"{data}/train.parquet").column("label").to_numpy().mean())
        metric = result.gate_reason.split(" ", 1)[0]
        assert f"(training mean {mean:.4g}, {metric} " in result.gate_reason, result.gate_reason


def test_gate_baseline_best_refuses_a_fair_model_that_a_baseline_beats(tmp_path: Path) -> None:
    data, w = write_dataset(tmp_path / "ds", "regression")
    # Half the true slope: far better than the mean, far worse than ridge regression.
    model = write_linear_model(tmp_path / "m", "regression", w, skill=0.5,
                               scale=[300_000.0, 50_000.0])  # fmt: skip
    assert run_evaluate(tmp_path, model, data).gate_passed
    result = run_evaluate(tmp_path, model, data, baseline="best")
    assert not result.gate_passed
    assert "does not beat the best baseline, linear (ridge regression, rmse " in result.gate_reason


# --- the target scale ---------------------------------------------------------------------------


def test_target_scale_round_trips_and_metrics_are_in_target_units(tmp_path: Path) -> None:
    data, w = write_dataset(tmp_path / "ds", "regression")
    model = write_linear_model(tmp_path / "m", "regression", w, skill=1.0,
                               scale=[300_000.0, 50_000.0])  # fmt: skip
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    assert meta["target_scale"] == {"mean": 300_000.0, "std": 50_000.0}
    x_te, y_te = split_arrays(data, "test")
    loaded = load_model(model)
    raw = loaded.module(torch.from_numpy(x_te)).squeeze(-1).double()
    pred = predict(loaded, torch.from_numpy(x_te)).numpy()
    np.testing.assert_allclose(pred, raw.detach().numpy() * 50_000 + 300_000, rtol=1e-6)
    result = run_evaluate(tmp_path, model, data)
    assert result.metrics["rmse"] == pytest.approx(math.sqrt(skm.mean_squared_error(y_te, pred)))
    assert result.metrics["r2"] > 0.99
    assert 100 < result.metrics["rmse"] < 2_000  # the noise's scale, in the target's units


@pytest.mark.parametrize(
    "scale", [{"mean": 1.0}, {"mean": 0.0, "std": 0.0}, {"mean": "a", "std": 1.0}, [1, 2]]
)
def test_a_garbled_target_scale_is_refused_on_load(tmp_path: Path, scale: Any) -> None:
    _, w = write_dataset(tmp_path / "ds", "regression")
    model = write_linear_model(tmp_path / "m", "regression", w, skill=1.0, scale=[0.0, 1.0])
    meta_file = tmp_path / "m" / "model.json"
    meta = json.loads(meta_file.read_text())
    meta["target_scale"] = scale
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="bad target_scale"):
        load_model(model)
