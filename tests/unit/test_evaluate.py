"""Tests for the evaluate step: metrics against scikit-learn, the gate, the report, failures."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from sklearn import metrics as skm

from trainer.base.errors import InputError
from trainer.base.typedconfig import from_dict
from trainer.config import ModelConfig
from trainer.models import ModelSpec, build_model
from trainer.models.export import load_model, predict, save_model
from trainer.steps.evaluate import EvaluateConfig, GateConfig, decide_gate, evaluate

FEATURES = ["f0", "f1", "f2", "f3"]
REPO = str(Path(__file__).resolve().parents[2])
LINEAR = ModelConfig(name="mlp", num_layers=0)  # a linear model whose weights we set by hand


@dataclass
class Table:
    """A test split and the true weights that generated it."""

    x: np.ndarray
    y: np.ndarray
    weights: np.ndarray  # [F, K] (classification) or [F, 1] (regression)


def make_split(task: str, *, classes: int = 3, rows: int = 600, seed: int = 0) -> Table:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, len(FEATURES))).astype(np.float32)
    k = classes if task == "classification" else 1
    w = rng.standard_normal((len(FEATURES), k)).astype(np.float32)
    noise = rng.standard_normal((rows, k)).astype(np.float32)
    if task == "classification":
        y: np.ndarray = (x @ w + noise).argmax(axis=1).astype(np.int64)
    else:
        y = (x @ w + 0.3 * noise)[:, 0].astype(np.float32)
    return Table(x, y, w)


def write_dataset(
    root: Path, table: Table, *, split: str = "test", columns: list[str] | None = None
) -> str:
    root.mkdir(parents=True, exist_ok=True)
    cols: dict[str, Any] = {name: table.x[:, i] for i, name in enumerate(columns or FEATURES)}
    cols["label"] = table.y
    pq.write_table(pa.table(cols), root / f"{split}.parquet")
    (root / "schema.json").write_text(json.dumps({"task": "?", "classes": None}))
    return str(root)


def write_model(
    uri: Path,
    table: Table,
    task: str,
    *,
    skill: float = 1.0,
    classes: list[str] | None = None,
    features: list[str] = FEATURES,
    metrics: dict[str, float] | None = None,
    history: list[dict[str, Any]] | None = None,
) -> str:
    """A linear model with weights ``skill * true weights`` (skill < 0: worse than chance)."""
    k = table.weights.shape[1]
    spec = ModelSpec(
        task=task,  # type: ignore[arg-type]
        in_features=len(features),
        num_classes=k if task == "classification" else None,
    )
    model = build_model(LINEAR, spec)
    with torch.no_grad():
        model.head.weight.copy_(torch.from_numpy(skill * table.weights.T))
        model.head.bias.zero_()
    save_model(
        str(uri),
        model,
        model_cfg=LINEAR,
        spec=spec,
        features=features,
        target="label",
        schema={"task": task, "classes": classes},
        metrics=metrics or {"val_loss": 0.5},
    )
    if history is not None:
        (uri / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    return str(uri)


HISTORY = [
    *({"event": "step", "step": s, "loss": 1.0 / (1 + s), "lr": 1e-3} for s in range(0, 100, 10)),
    {"event": "eval", "step": 50, "val_loss": 0.3, "val_accuracy": 0.8},
    {"event": "eval", "step": 100, "val_loss": 0.2, "val_accuracy": 0.85},
]


def predictions(model_uri: str, table: Table) -> torch.Tensor:
    """The model's raw outputs, computed apart from the step under test."""
    return predict(load_model(model_uri), torch.from_numpy(table.x))


def run(tmp_path: Path, model_uri: str, data_uri: str, **kw: Any):
    cfg = kw.pop("cfg", EvaluateConfig())
    return evaluate(
        cfg,
        model_uri=model_uri,
        dataset_uri=data_uri,
        report_uri=str(tmp_path / "report.html"),
        **kw,
    )


# --- Metrics -------------------------------------------------------------------------------------


@pytest.mark.parametrize("classes", [2, 4], ids=["binary", "multiclass"])
def test_classification_metrics_equal_sklearn(tmp_path: Path, classes: int) -> None:
    table = make_split("classification", classes=classes)
    model = write_model(tmp_path / "m", table, "classification", skill=0.7)
    data = write_dataset(tmp_path / "d", table)

    result = run(tmp_path, model, data)

    proba = torch.softmax(predictions(model, table).double(), dim=-1).numpy()
    pred = proba.argmax(axis=1)
    y = table.y
    auc = (
        skm.roc_auc_score(y, proba[:, 1])
        if classes == 2
        else skm.roc_auc_score(y, proba, multi_class="ovr", average="macro")
    )
    assert result.task == "classification"
    assert result.metrics == pytest.approx(
        {
            "accuracy": skm.accuracy_score(y, pred),
            "f1_macro": skm.f1_score(y, pred, average="macro"),
            "roc_auc": auc,
            "log_loss": skm.log_loss(y, proba),
        },
        rel=1e-9,
    )
    assert result.confusion_matrix == skm.confusion_matrix(y, pred).tolist()
    assert result.labels == [str(i) for i in range(classes)]
    assert result.num_rows == len(y)
    roc = result.roc
    assert roc is not None
    assert 2 < len(roc["fpr"]) <= 200  # 600 rows give more distinct cuts: downsampled
    assert len(roc["fpr"]) == len(roc["tpr"]) == len(roc["thresholds"])
    assert (roc["fpr"][0], roc["tpr"][0]) == (0.0, 0.0)
    assert (roc["fpr"][-1], roc["tpr"][-1]) == (1.0, 1.0)
    assert all(0.0 <= t <= 1.0 for t in roc["thresholds"])  # no +inf: the JSON stays valid


def test_regression_metrics_equal_sklearn(tmp_path: Path) -> None:
    table = make_split("regression")
    model = write_model(tmp_path / "m", table, "regression", skill=0.9)
    data = write_dataset(tmp_path / "d", table)

    result = run(tmp_path, model, data)

    pred = predictions(model, table).double().numpy()
    y = table.y.astype(np.float64)
    assert result.task == "regression"
    assert result.metrics == pytest.approx(
        {
            "rmse": np.sqrt(skm.mean_squared_error(y, pred)),
            "mae": skm.mean_absolute_error(y, pred),
            "r2": skm.r2_score(y, pred),
        },
        rel=1e-9,
    )
    assert result.confusion_matrix is None and result.roc is None and result.labels is None
    assert result.gate_metric == "rmse"


def test_split_missing_a_class_still_scores_every_metric(tmp_path: Path) -> None:
    full = make_split("classification", classes=3)
    keep = full.y != 2
    table = Table(full.x[keep], full.y[keep], full.weights)
    model = write_model(tmp_path / "m", table, "classification", skill=0.7)
    data = write_dataset(tmp_path / "d", table)

    result = run(tmp_path, model, data)

    proba = torch.softmax(predictions(model, table).double(), dim=-1).numpy()
    y = table.y
    # Class 2 has no one-vs-rest AUC: the macro average runs over the classes present.
    ovr = np.mean([skm.roc_auc_score(y == c, proba[:, c]) for c in (0, 1)])
    assert result.metrics["log_loss"] == pytest.approx(skm.log_loss(y, proba, labels=[0, 1, 2]))
    assert result.metrics["roc_auc"] == pytest.approx(ovr)
    assert result.confusion_matrix is not None
    assert len(result.confusion_matrix) == 3 and result.confusion_matrix[2] == [0, 0, 0]


def test_single_class_split_has_no_auc_and_gating_on_it_fails(tmp_path: Path) -> None:
    full = make_split("classification", classes=2)
    keep = full.y == 0
    table = Table(full.x[keep], full.y[keep], full.weights)
    model = write_model(tmp_path / "m", table, "classification")
    data = write_dataset(tmp_path / "d", table)

    result = run(tmp_path, model, data, cfg=EvaluateConfig(gate=GateConfig(metric="roc_auc")))

    assert "roc_auc" not in result.metrics and result.roc is None
    assert not result.gate_passed
    assert "roc_auc is undefined" in result.gate_reason


# --- Gate ----------------------------------------------------------------------------------------

GATE_CASES = [
    # metric, value, threshold, min_improvement, champion (None: no champion), passed, reason
    ("accuracy", 0.86, 0.80, 0.0, None, True, "accuracy 0.86 >= threshold 0.8"),
    ("accuracy", 0.80, 0.80, 0.0, None, True, "accuracy 0.8 >= threshold 0.8"),
    ("accuracy", 0.70, 0.80, 0.0, None, False, "accuracy 0.7 < threshold 0.8"),
    ("rmse", 0.40, 0.50, 0.0, None, True, "rmse 0.4 <= threshold 0.5"),
    ("rmse", 0.60, 0.50, 0.0, None, False, "rmse 0.6 > threshold 0.5"),
    ("log_loss", 0.30, 0.25, 0.0, None, False, "log_loss 0.3 > threshold 0.25"),
    ("accuracy", 0.86, None, 0.0, None, True, "accuracy 0.86 (no threshold) and no champion"),
    ("accuracy", 0.86, 0.80, 0.0, 0.84, True, "and beats champion v3 (0.84)"),
    ("accuracy", 0.86, 0.80, 0.0, 0.90, False, "does not beat champion v3 (0.9)"),
    ("accuracy", 0.86, 0.80, 0.0, 0.86, False, "does not beat champion v3 (0.86)"),
    ("accuracy", 0.86, 0.80, 0.05, 0.84, False, "by only 0.02, less than min_improvement 0.05"),
    ("accuracy", 0.86, 0.80, 0.02, 0.84, True, "by 0.02 >= min_improvement 0.02"),
    ("rmse", 0.40, None, 0.0, 0.45, True, "beats champion v3 (0.45)"),
    ("rmse", 0.50, None, 0.0, 0.45, False, "does not beat champion v3 (0.45)"),
    ("r2", 0.90, 0.95, 0.0, 0.80, False, "r2 0.9 < threshold 0.95 and beats champion v3"),
]


@pytest.mark.parametrize(
    ("metric", "value", "threshold", "min_improvement", "champion", "passed", "reason"),
    GATE_CASES,
    ids=[
        "threshold-pass-max",
        "threshold-equal-passes",
        "threshold-fail-max",
        "threshold-pass-min",
        "threshold-fail-min",
        "threshold-fail-logloss",
        "nothing-to-check",
        "champion-worse",
        "champion-better",
        "champion-equal-keeps-champion",
        "improvement-too-small",
        "improvement-exactly-enough",
        "champion-worse-min-metric",
        "champion-better-min-metric",
        "threshold-fails-champion-beaten",
    ],
)
def test_gate_table(metric, value, threshold, min_improvement, champion, passed, reason) -> None:
    ok, why = decide_gate(
        metric=metric,
        value=value,
        threshold=threshold,
        min_improvement=min_improvement,
        has_champion=champion is not None,
        champion_value=champion,
        champion_name="v3",
    )
    assert ok is passed
    assert reason in why


@pytest.mark.parametrize(
    ("champion_skill", "passed", "reason"),
    [
        (0.2, True, "beats champion v7"),
        (1.0, False, "does not beat champion v7"),
        (None, False, "does not beat champion v7"),  # the candidate itself: a tie
    ],
    ids=["champion-worse", "champion-better", "champion-equal"],
)
def test_champion_is_rescored_on_the_same_split(
    tmp_path: Path, champion_skill: float | None, passed: bool, reason: str
) -> None:
    table = make_split("classification", classes=3)
    model = write_model(tmp_path / "m", table, "classification", skill=0.5)
    champion = (
        model
        if champion_skill is None
        else write_model(tmp_path / "c", table, "classification", skill=champion_skill)
    )
    data = write_dataset(tmp_path / "d", table)
    cfg = EvaluateConfig(gate=GateConfig(metric="log_loss"))

    result = run(tmp_path, model, data, cfg=cfg, champion_model_uri=champion, champion_name="v7")

    proba = torch.softmax(predictions(champion, table).double(), dim=-1).numpy()
    assert result.champion_metrics is not None
    assert result.champion_metrics["log_loss"] == pytest.approx(skm.log_loss(table.y, proba))
    assert result.gate_passed is passed
    assert reason in result.gate_reason


@pytest.mark.parametrize(
    ("stored", "registry", "passed", "reason"),
    [
        ({"accuracy": 0.1}, None, True, "beats champion v1 (0.1; stored accuracy from its metrics"),
        ({"val_accuracy": 0.99}, None, False, "does not beat champion v1 (0.99; stored val_accur"),
        ({"val_loss": 0.2}, None, False, "champion v1 has no accuracy to compare against"),
        ({"accuracy": 0.1}, {"accuracy": 0.99}, False, "(0.99; stored accuracy from the registry"),
    ],
    ids=["stored-worse", "stored-val-better", "stored-lacks-metric", "registry-metrics-win"],
)
def test_champion_with_other_features_falls_back_to_stored_metrics(
    tmp_path: Path,
    stored: dict[str, float],
    registry: dict[str, float] | None,
    passed: bool,
    reason: str,
) -> None:
    table = make_split("classification", classes=3)
    model = write_model(tmp_path / "m", table, "classification")
    champion = write_model(
        tmp_path / "c", table, "classification", features=["a", "b", "c", "d"], metrics=stored
    )
    data = write_dataset(tmp_path / "d", table)

    result = run(
        tmp_path,
        model,
        data,
        champion_model_uri=champion,
        champion_name="v1",
        champion_stored_metrics=registry,
    )

    assert result.champion_metrics == (registry or stored)
    assert result.gate_passed is passed
    assert reason in result.gate_reason
    assert "its features differ from the candidate's, so it was not re-scored" in result.gate_reason
    assert "champion (stored metrics)" in (tmp_path / "report.html").read_text()


def test_metrics_file_holds_the_result_as_strict_json(tmp_path: Path) -> None:
    table = make_split("classification", classes=2)
    model = write_model(tmp_path / "m", table, "classification")
    data = write_dataset(tmp_path / "d", table)
    out = tmp_path / "out" / "metrics.json"

    result = run(tmp_path, model, data, metrics_uri=str(out))

    def no_nan(name: str) -> None:
        raise AssertionError(f"{name} in metrics JSON")

    assert json.loads(out.read_text(), parse_constant=no_nan) == result.to_dict()


# --- Report --------------------------------------------------------------------------------------


class _TagChecker(HTMLParser):
    """Collects tags and checks that every non-void element is closed in order."""

    VOID = frozenset({"meta", "img", "br", "hr", "link", "input"})

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()


def parse_report(path: Path) -> tuple[str, list[bytes]]:
    """The report's text and decoded images, after checking it is well-formed and offline."""
    html = path.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>")
    checker = _TagChecker()
    checker.feed(html)
    checker.close()
    assert checker.stack == []
    assert "http://" not in html and "https://" not in html
    srcs = [attrs.get("src") or "" for tag, attrs in checker.tags if tag == "img"]
    assert all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not any(tag in ("script", "link", "iframe") for tag, _ in checker.tags)
    images = [base64.b64decode(s.split(",", 1)[1]) for s in srcs]
    assert all(img.startswith(b"\x89PNG\r\n\x1a\n") and len(img) > 5000 for img in images)
    return html, images


@pytest.mark.parametrize(
    ("task", "history", "images", "headings"),
    [
        ("classification", HISTORY, 3, ["Training loss", "Confusion matrix", "ROC curve"]),
        ("classification", None, 2, ["Confusion matrix", "ROC curve"]),
        ("regression", HISTORY, 2, ["Training loss", "Residuals"]),
        ("regression", None, 1, ["Residuals"]),
    ],
    ids=["classification", "classification-no-log", "regression", "regression-no-log"],
)
def test_report_is_self_contained_html_with_the_plots(
    tmp_path: Path, task: str, history: list | None, images: int, headings: list[str]
) -> None:
    table = make_split(task, classes=2)
    model = write_model(tmp_path / "m", table, task, history=history)
    data = write_dataset(tmp_path / "d", table)

    result = run(tmp_path, model, data)

    html, pngs = parse_report(tmp_path / "report.html")
    assert len(pngs) == images
    assert f"Gate: {'PASS' if result.gate_passed else 'FAIL'}" in html
    assert result.gate_reason in html
    for heading in headings:
        assert f"<h2>{heading}</h2>" in html
    if history is None:
        assert "No training log" in html


def test_report_escapes_text_from_the_data(tmp_path: Path) -> None:
    table = make_split("classification", classes=2)
    labels = ["<script>alert(1)</script>", "a & $b$"]
    model = write_model(tmp_path / "m", table, "classification", classes=labels)
    data = write_dataset(tmp_path / "d", table)

    result = run(tmp_path, model, data)

    html, pngs = parse_report(tmp_path / "report.html")  # no <script> element got through
    assert result.labels == labels
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "a &amp; $b$" in html
    assert len(pngs) == 2  # "$b$" as a tick label did not break the confusion-matrix plot


# --- Failures ------------------------------------------------------------------------------------


def _missing_model(tmp: Path, table: Table) -> dict[str, Any]:
    return {"model_uri": str(tmp / "nowhere")}


def _garbled_model(tmp: Path, table: Table) -> dict[str, Any]:
    uri = write_model(tmp / "m", table, "classification")
    (tmp / "m" / "model.json").write_text("{not json")
    return {"model_uri": uri}


def _missing_split(tmp: Path, table: Table) -> dict[str, Any]:
    return {"cfg": EvaluateConfig(split="holdout")}


def _missing_features(tmp: Path, table: Table) -> dict[str, Any]:
    uri = write_model(tmp / "m2", table, "classification", features=["f0", "f1", "age", "income"])
    return {"model_uri": uri}


def _wrong_task_metric(tmp: Path, table: Table) -> dict[str, Any]:
    return {"cfg": EvaluateConfig(gate=GateConfig(metric="rmse"))}


@pytest.mark.parametrize(
    ("setup", "code", "says"),
    [
        (_missing_model, "E_MODEL", "missing model.json"),
        (_garbled_model, "E_MODEL", "not valid JSON"),
        (_missing_split, "E_DATA", "holdout.parquet"),
        (_missing_features, "E_SCHEMA", "lacks 2 column(s) the model needs: age, income"),
        (_wrong_task_metric, "E_CONFIG", "['auto', 'accuracy', 'f1_macro', 'roc_auc', 'log_loss']"),
    ],
    ids=["model-missing", "model-garbled", "split-missing", "features-missing", "metric-for-task"],
)
def test_bad_input_names_the_problem_and_writes_nothing(
    tmp_path: Path, setup, code: str, says: str
) -> None:
    table = make_split("classification", classes=3)
    kw: dict[str, Any] = {
        "model_uri": write_model(tmp_path / "m", table, "classification"),
        "data_uri": write_dataset(tmp_path / "d", table),
        "metrics_uri": str(tmp_path / "metrics.json"),
    }
    kw.update(setup(tmp_path, table))

    with pytest.raises(InputError) as info:
        run(tmp_path, kw.pop("model_uri"), kw.pop("data_uri"), **kw)

    assert info.value.code == code
    assert says in str(info.value)
    assert not (tmp_path / "report.html").exists()
    assert not (tmp_path / "metrics.json").exists()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"gate": {"metric": "precision"}}, "gate.metric"),
        ({"gate": {"min_improvement": -0.1}}, "gate.min_improvement"),
        ({"gate": {"threshold": float("nan")}}, "gate.threshold"),
        ({"gate": {"treshold": 0.8}}, "gate.treshold"),
        ({"batch_size": 0}, "batch_size"),
        ({"split": "../train"}, "split"),
        ({"model_plugins": ["./evil"]}, "model_plugins"),
        ({"model_plugins": ["pkg.mod:build:x"]}, "model_plugins"),
    ],
    ids=[
        "unknown-metric",
        "negative-improvement",
        "nan-threshold",
        "typo",
        "batch",
        "split-path",
        "plugin-path",
        "plugin-malformed",
    ],
)
def test_bad_config_is_rejected_naming_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError) as info:
        from_dict(EvaluateConfig, data)
    assert info.value.code == "E_CONFIG"
    assert info.value.where == field


def test_config_from_dict_round_trip() -> None:
    cfg = from_dict(
        EvaluateConfig, {"gate": {"metric": "f1_macro", "threshold": 0.7}, "split": "val"}
    )
    assert cfg.gate == GateConfig(metric="f1_macro", threshold=0.7)
    assert (cfg.batch_size, cfg.split) == (8192, "val")


def test_report_counts_no_stray_images(tmp_path: Path) -> None:
    """A multiclass report with a log: one loss plot, one confusion matrix, one ROC."""
    table = make_split("classification", classes=4)
    model = write_model(tmp_path / "m", table, "classification", history=HISTORY)
    data = write_dataset(tmp_path / "d", table)
    run(tmp_path, model, data)
    html, pngs = parse_report(tmp_path / "report.html")
    assert len(pngs) == 3
    assert re.search(r"roc_auc \(one-vs-rest macro\) = 0\.\d{4}", html)


# --- Artifacts never run code ---------------------------------------------------------------------


def plant_plugin(model_dir: Path, module: str, marker: Path, where: Path | None = None) -> None:
    """Make ``model.json`` name ``<module>:build`` and put ``<module>.py`` (in the model folder
    unless ``where``), which writes ``marker`` the moment it is imported."""
    meta = json.loads((model_dir / "model.json").read_text())
    meta["model"]["name"] = f"{module}:build"
    (model_dir / "model.json").write_text(json.dumps(meta))
    folder = where or model_dir
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(
        f"open({str(marker)!r}, 'w').write('code from the artifact ran')\n"
        "from torch import nn\n"
        "def build(cfg, spec):\n"
        "    return nn.Linear(spec.in_features, spec.num_classes)\n"
    )


@pytest.mark.parametrize(
    ("role", "allowed"),
    [("candidate", []), ("champion", []), ("candidate", ["{module}"]), ("champion", ["{module}"])],
    ids=["candidate", "champion", "candidate-allowed", "champion-allowed"],
)
def test_a_model_folder_never_runs_its_own_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, role: str, allowed: list[str]
) -> None:
    """A ``.py`` next to ``model.json`` is refused, even where the config allows its name."""
    table = make_split("classification", classes=3)
    data = write_dataset(tmp_path / "d", table)
    good = write_model(tmp_path / "good", table, "classification")
    bad_dir = tmp_path / "bad"
    write_model(bad_dir, table, "classification")
    module, marker = f"evil_{role}_{len(allowed)}", tmp_path / "MARKER"
    plant_plugin(bad_dir, module, marker)
    monkeypatch.chdir(bad_dir)  # as after ``cd model; python -m trainer evaluate --model .``
    monkeypatch.syspath_prepend(str(bad_dir))
    cfg = EvaluateConfig(model_plugins=[a.format(module=module) for a in allowed])
    candidate, champion = (str(bad_dir), good) if role == "candidate" else (good, str(bad_dir))

    with pytest.raises(InputError) as info:
        run(tmp_path, candidate, data, cfg=cfg, champion_model_uri=champion)

    assert info.value.code == "E_MODEL"
    assert module in info.value.message
    if allowed:
        assert "installed environment" in info.value.message
    else:
        assert info.value.where == str(bad_dir / "model.json")
    assert not marker.exists()
    assert module not in sys.modules
    assert not (tmp_path / "report.html").exists()


def test_an_allowed_installed_plugin_model_is_evaluated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    table = make_split("classification", classes=3)
    spec = ModelSpec(task="classification", in_features=len(FEATURES), num_classes=3)
    cfg = ModelConfig(name="tests.plugins.tiny:build")
    model = build_model(cfg, spec)
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(table.weights.T))
        model.bias.zero_()
    uri = str(tmp_path / "plugin-model")
    save_model(
        uri,
        model,
        model_cfg=cfg,
        spec=spec,
        features=FEATURES,
        target="label",
        schema=None,
        metrics={},
    )
    result = run(
        tmp_path,
        uri,
        write_dataset(tmp_path / "d", table),
        cfg=EvaluateConfig(model_plugins=["tests.plugins.tiny"]),
    )
    assert result.metrics["accuracy"] > 0.6


@pytest.mark.parametrize("allow", [False, True], ids=["not-allowed", "allowed-by-name"])
def test_python_m_trainer_evaluate_inside_the_model_folder_runs_none_of_its_code(
    tmp_path: Path, allow: bool
) -> None:
    """The CLI a person runs: ``cd model && python -m trainer evaluate --model .``."""
    table = make_split("classification", classes=3)
    data = write_dataset(tmp_path / "d", table)
    model_dir, marker = tmp_path / "model", tmp_path / "MARKER"
    write_model(model_dir, table, "classification")
    plant_plugin(model_dir, "evil", marker)
    cmd = [sys.executable, "-m", "trainer", "evaluate", "--model", ".", "--dataset", data]
    cmd += ["--report", str(tmp_path / "report.html")]
    if allow:
        cmd += ["--set", 'model_plugins=["evil"]']
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        cmd, cwd=model_dir, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ERROR [evaluate] E_MODEL: ")
    if allow:  # allowed by name, but only the installed environment is searched
        assert "cannot import evil (No module named 'evil' in the installed environment)" in last
    else:
        assert "would import module 'evil', which is not allowed" in last
        assert last.endswith("(./model.json)")
    assert not marker.exists()
    assert not (tmp_path / "report.html").exists()


# --- Scoring a split row group by row group ------------------------------------------------------


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_a_split_of_many_row_groups_is_scored_in_one_streamed_pass(
    tmp_path: Path, task: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The split (and the training split the baselines fit on) is read a row group at a time,
    never whole, and the metrics, the champion's and the baselines' equal those of the whole
    split scored at once."""
    table = make_split(task, rows=3000, seed=4)
    train = make_split(task, rows=2000, seed=5)
    data = tmp_path / "d"
    write_dataset(data, table)
    write_dataset(data, train, split="train")
    for split, t in (("test", table), ("train", train)):  # 64 row groups of ~47 rows
        cols: dict[str, Any] = {name: t.x[:, i] for i, name in enumerate(FEATURES)}
        pq.write_table(pa.table({**cols, "label": t.y}), data / f"{split}.parquet",
                       row_group_size=47)  # fmt: skip
    model = write_model(tmp_path / "m", table, task, skill=0.8)
    champ = write_model(tmp_path / "c", table, task, skill=0.5)
    seen: list[int] = []
    real = pq.ParquetFile.read_row_group

    def one_group(self: pq.ParquetFile, i: int, *a: Any, **kw: Any) -> pa.Table:
        got = real(self, i, *a, **kw)
        seen.append(got.num_rows)
        return got

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", one_group)
    result = run(tmp_path, model, str(data), champion_model_uri=champ)
    assert max(seen) == 47 and sum(seen) == 3000 + 2000
    from trainer.steps.evaluate.baselines import fit_and_score
    from trainer.steps.evaluate.metrics import score_predictions, softmax

    def whole(uri: str) -> dict[str, float]:
        out = predictions(uri, table)
        predicted = softmax(out) if task == "classification" else out.double().numpy()
        return score_predictions(task, table.y, predicted).metrics

    assert result.metrics == pytest.approx(whole(model), rel=1e-9)
    assert result.champion_metrics == pytest.approx(whole(champ), rel=1e-9)
    k = table.weights.shape[1] if task == "classification" else None
    ref = fit_and_score(task, train.x, train.y, table.x, table.y, num_classes=k)
    assert result.baselines.keys() == ref.keys()
    for name, scored in ref.items():
        assert result.baselines[name] == pytest.approx(scored.metrics, rel=1e-9), name
