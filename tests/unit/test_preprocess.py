"""Tests for trainer.steps.preprocess: outputs, splits, train-only fits, determinism, bad input."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from trainer.__main__ import main as trainer_main
from trainer.config import from_dict
from trainer.data import TabularDataset
from trainer.errors import InputError
from trainer.outputs import OUTPUT_MARKER
from trainer.steps.demo_data import make_demo_table
from trainer.steps.preprocess import PreprocessConfig, PreprocessResult, preprocess
from trainer.steps.tabular import split_indices

ROWS = 3000
OUTPUTS = ("train.parquet", "val.parquet", "test.parquet", "schema.json", "stats.json")


@pytest.fixture(scope="module")
def demo() -> pa.Table:
    return make_demo_table(ROWS, seed=1)


def _run(data: Path | str, out: Path, **cfg: Any) -> PreprocessResult:
    config = from_dict(PreprocessConfig, {"target": "churned", **cfg})
    return preprocess(config, data_uri=str(data), output_uri=str(out))


def _hashes(out: Path) -> dict[str, str]:
    return {n: hashlib.sha256((out / n).read_bytes()).hexdigest() for n in OUTPUTS}


def _write_parquet_file(tmp: Path, table: pa.Table) -> Path:
    pq.write_table(table, tmp / "data.parquet")
    return tmp / "data.parquet"


def _write_parquet_folder(tmp: Path, table: pa.Table) -> Path:
    folder = tmp / "data"
    folder.mkdir()
    for i, start in enumerate(range(0, table.num_rows, 1000)):
        pq.write_table(table.slice(start, 1000), folder / f"part-{i}.parquet")
    (folder / "_SUCCESS").write_text("")  # markers written by Spark and friends: ignored
    return folder


def _write_csv(tmp: Path, table: pa.Table) -> Path:
    pacsv.write_csv(table, tmp / "data.csv")
    return tmp / "data.csv"


@pytest.mark.parametrize(
    "write",
    [_write_parquet_file, _write_parquet_folder, _write_csv],
    ids=["parquet-file", "parquet-folder", "csv-file"],
)
def test_writes_splits_schema_and_stats_that_the_trainer_loads(
    tmp_path: Path, demo: pa.Table, write: Callable[[Path, pa.Table], Path]
) -> None:
    out = tmp_path / "out"
    result = _run(write(tmp_path, demo), out)

    assert sorted(p.name for p in out.iterdir()) == sorted([*OUTPUTS, OUTPUT_MARKER])
    assert result.task == "classification"
    assert result.classes == ["no", "yes"]
    assert result.train_rows + result.val_rows + result.test_rows == ROWS
    schema = json.loads((out / "schema.json").read_text())
    assert schema["format"] == "gpupipe.schema/v1"
    assert schema["features"] == result.features
    assert schema["splits"] == {
        "train": result.train_rows,
        "val": result.val_rows,
        "test": result.test_rows,
    }
    kinds = {c["name"]: c["kind"] for c in schema["columns"]}
    assert kinds["income"] == "numeric" and kinds["region"] == "categorical"
    assert "income__missing" in result.features  # income has gaps in the demo table
    assert "device=__missing__" in result.features and "region=__other__" in result.features
    stats = json.loads((out / "stats.json").read_text())
    assert stats["columns"]["income"]["missing"] > 0
    assert sum(stats["target"]["test"]["classes"].values()) == result.test_rows

    for split, rows in (("train", result.train_rows), ("test", result.test_rows)):
        table = pq.read_table(out / f"{split}.parquet")
        assert table.column_names == [*result.features, "churned"]
        assert {str(t) for t in table.schema.types[:-1]} == {"float"}
        ds = TabularDataset.from_parquet(
            str(out / f"{split}.parquet"), target="churned", task="classification"
        )
        assert len(ds) == rows and ds.feature_names == result.features
        assert set(ds.target.unique().tolist()) == {0, 1}
    train = pq.read_table(out / "train.parquet")
    assert abs(float(np.mean(train.column("income").to_numpy()))) < 1e-3  # standardised on train


def test_split_is_stratified_and_sized_by_the_fractions(tmp_path: Path, demo: pa.Table) -> None:
    result = _run(_write_parquet_file(tmp_path, demo), tmp_path / "out", val_fraction=0.2)

    assert result.val_rows == pytest.approx(0.2 * ROWS, abs=2)
    assert result.test_rows == pytest.approx(0.15 * ROWS, abs=2)
    overall = np.mean(np.array(demo.column("churned").to_pylist()) == "yes")
    for split in ("train", "val", "test"):
        y = pq.read_table(tmp_path / "out" / f"{split}.parquet").column("churned").to_numpy()
        assert np.mean(y) == pytest.approx(overall, abs=0.01), split


def _regression_table(n: int = 1000) -> pa.Table:
    rng = np.random.default_rng(3)
    x = rng.normal(10.0, 2.0, n)
    return pa.table(
        {
            "x": x,
            "colour": rng.choice(["red", "green", "blue"], n),
            "y": (3 * x + rng.normal(0, 1, n)).astype(np.float32),
        }
    )


def test_statistics_and_categories_are_fitted_on_the_training_split_only(tmp_path: Path) -> None:
    table = _regression_table()
    _, _, test = split_indices(
        table.num_rows, classes=None, val_fraction=0.15, test_fraction=0.15, seed=0
    )
    x = table.column("x").to_numpy().copy()
    colour = np.array(table.column("colour").to_pylist(), dtype=object)
    x[test] = 1e6  # outliers only where the test split lands
    colour[test[:5]] = "ultraviolet"  # a category that training never sees
    table = table.set_column(0, "x", pa.array(x)).set_column(1, "colour", pa.array(colour))
    result = _run(_write_parquet_file(tmp_path, table), tmp_path / "out", target="y")

    schema = json.loads((tmp_path / "out" / "schema.json").read_text())
    x_fit = next(c for c in schema["columns"] if c["name"] == "x")
    assert x_fit["mean"] == pytest.approx(10.0, abs=0.3)
    assert x_fit["std"] == pytest.approx(2.0, abs=0.2)
    assert result.task == "regression"
    assert "colour=ultraviolet" not in result.features
    test_out = pq.read_table(tmp_path / "out" / "test.parquet")
    assert test_out.column("colour=__other__").to_numpy().sum() == 5
    assert test_out.column("y").type == pa.float32()


def test_same_input_and_seed_give_identical_bytes_and_another_seed_another_split(
    tmp_path: Path, demo: pa.Table
) -> None:
    data = _write_parquet_file(tmp_path, demo)
    _run(data, tmp_path / "a")
    _run(data, tmp_path / "b")
    _run(data, tmp_path / "c", seed=7)

    assert _hashes(tmp_path / "a") == _hashes(tmp_path / "b")
    other = _hashes(tmp_path / "c")
    assert other["train.parquet"] != _hashes(tmp_path / "a")["train.parquet"]


def test_rare_categories_beyond_max_categories_become_other(tmp_path: Path, demo: pa.Table) -> None:
    result = _run(_write_parquet_file(tmp_path, demo), tmp_path / "out", max_categories=3)

    region = [f for f in result.features if f.startswith("region=")]
    assert region == ["region=east", "region=north", "region=south", "region=__other__"]
    train = pq.read_table(tmp_path / "out" / "train.parquet")
    onehot = np.column_stack([train.column(f).to_numpy() for f in region])
    assert (onehot.sum(axis=1) == 1).all()  # every row in exactly one region column


@pytest.mark.parametrize(
    ("cfg", "present", "absent"),
    [
        ({}, ["income__missing"], []),
        ({"missing_indicator": False}, [], ["income__missing"]),
        (
            {"columns": {"age": "numeric", "plan": "categorical", "region": "drop"}},
            ["age", "plan=pro"],
            ["income", "region=north"],
        ),
        ({"columns": {"support_calls": "categorical"}}, ["support_calls=0"], ["support_calls"]),
    ],
    ids=["indicator", "no-indicator", "declared-schema", "declared-categorical-number"],
)
def test_config_shapes_the_features(
    tmp_path: Path, demo: pa.Table, cfg: dict[str, Any], present: list[str], absent: list[str]
) -> None:
    result = _run(_write_parquet_file(tmp_path, demo), tmp_path / "out", **cfg)

    assert set(present) <= set(result.features)
    assert not set(absent) & set(result.features)


@pytest.mark.parametrize(
    ("target", "task", "classes"),
    [
        (np.array([0, 1, 2] * 40), "classification", ["0", "1", "2"]),
        (np.array([1.5, 2.25, 3.0] * 40), "regression", None),
        (np.arange(120), "regression", None),
        (np.array([True, False] * 60), "classification", ["false", "true"]),
    ],
    ids=["few-ints", "floats", "many-ints", "bools"],
)
def test_auto_task_follows_the_target(
    tmp_path: Path, target: np.ndarray, task: str, classes: list[str] | None
) -> None:
    table = pa.table({"x": np.arange(len(target), dtype=np.float64), "label": target})
    result = _run(_write_parquet_file(tmp_path, table), tmp_path / "out", target="label")

    assert (result.task, result.classes) == (task, classes)


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        (["1", "2.5", " 3", "-4e2", "5", None], "numeric"),
        (["a", "b", "c", "d", "7", None], "categorical"),
    ],
    ids=["numbers-as-text", "words-with-a-number"],
)
def test_text_columns_are_typed_by_their_values(
    tmp_path: Path, values: list[str | None], kind: str
) -> None:
    _run(_write_parquet_file(tmp_path, _table(v=values)), tmp_path / "out")

    schema = json.loads((tmp_path / "out" / "schema.json").read_text())
    assert {c["name"]: c["kind"] for c in schema["columns"]}["v"] == kind


# --- bad input ------------------------------------------------------------------------------


def _table(**columns: Any) -> pa.Table:
    base: dict[str, Any] = {"x": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "churned": ["yes", "no"] * 3}
    return pa.table({**base, **columns})


def _csv(text: str) -> Callable[[Path], Path]:
    def write(tmp: Path) -> Path:
        (tmp / "data.csv").write_text(text)
        return tmp / "data.csv"

    return write


def _parquet(table: pa.Table) -> Callable[[Path], Path]:
    return lambda tmp: _write_parquet_file(tmp, table)


def _empty_folder(tmp: Path) -> Path:
    (tmp / "data").mkdir()
    (tmp / "data" / "notes.md").write_text("no data here")
    return tmp / "data"


def _disagreeing_files(tmp: Path) -> Path:
    (tmp / "data").mkdir()
    pq.write_table(_table(), tmp / "data" / "a.parquet")
    pq.write_table(_table().drop_columns(["x"]), tmp / "data" / "b.parquet")
    return tmp / "data"


_NUMBERS_THEN_A_WORD = "x,churned\n1.5,yes\n2.5,no\n3.5,yes\nabc,no\n4.5,yes\n5.5,no\n"

BAD_INPUTS = [
    ("missing-file", lambda tmp: tmp / "nope.parquet", {}, "E_DATA", ["nope.parquet", "not found"]),
    ("no-data-files", _empty_folder, {}, "E_DATA", ["no data files"]),
    ("empty-csv", _csv("x,churned\n"), {}, "E_EMPTY", ["0 rows", "data.csv"]),
    ("empty-file", _csv(""), {}, "E_EMPTY", ["data.csv"]),
    ("empty-parquet", _parquet(_table().slice(0, 0)), {}, "E_EMPTY", ["0 rows"]),
    (
        "missing-target",
        _parquet(_table().drop_columns(["churned"])),
        {},
        "E_COLUMN",
        ["'churned'", "columns: x"],
    ),
    ("one-class", _parquet(_table(churned=["yes"] * 6)), {}, "E_TARGET", ["one class", "'yes'"]),
    (
        "target-missing-value",
        _parquet(_table(churned=["yes", "no", None, "no", "yes", "no"])),
        {},
        "E_TARGET",
        ["'churned'", "row 3"],
    ),
    (
        "all-missing-column",
        _parquet(_table(notes=pa.nulls(6, pa.string()))),
        {},
        "E_ALL_MISSING",
        ["'notes'"],
    ),
    (
        "all-nan-column",
        _parquet(_table(x=[float("nan")] * 6)),
        {},
        "E_ALL_MISSING",
        ["'x'"],
    ),
    (
        "infinite-parquet",
        _parquet(_table(x=[1.0, 2.0, 3.0, 4.0, float("inf"), 6.0])),
        {},
        "E_INFINITE",
        ["'x'", "data.parquet row 5"],
    ),
    (
        "infinite-csv",
        _csv("x,churned\n1,yes\n2,no\n-inf,yes\n4,no\n"),
        {},
        "E_INFINITE",
        ["'x'", "data.csv line 4"],
    ),
    (
        "mixed-types-csv",
        _csv(_NUMBERS_THEN_A_WORD),
        {},
        "E_MIXED_TYPES",
        ["'x'", "'abc'", "data.csv line 5"],
    ),
    (
        "declared-column-absent",
        _parquet(_table()),
        {"columns": {"x": "numeric", "ghost": "categorical"}},
        "E_SCHEMA",
        ["'ghost'", "not in the data"],
    ),
    (
        "declared-numeric-holds-text",
        _parquet(_table(plan=["basic", "pro"] * 3)),
        {"columns": {"x": "numeric", "plan": "numeric"}},
        "E_SCHEMA",
        ["'plan'", "'basic'", "row 1"],
    ),
    ("files-disagree", _disagreeing_files, {}, "E_SCHEMA", ["b.parquet", "'x'"]),
    ("unknown-config-key", _parquet(_table()), {"taget": "y"}, "E_CONFIG", ["taget"]),
    (
        "bad-config-value",
        _parquet(_table()),
        {"val_fraction": 0.6, "test_fraction": 0.5},
        "E_CONFIG",
        ["test_fraction", "0.5"],
    ),
    (
        "unknown-column-kind",
        _parquet(_table()),
        {"columns": {"x": "text"}},
        "E_CONFIG",
        ["columns.x", "'text'"],
    ),
]


@pytest.mark.parametrize(
    ("write", "cfg", "code", "needles"),
    [case[1:] for case in BAD_INPUTS],
    ids=[case[0] for case in BAD_INPUTS],
)
def test_bad_input_fails_with_one_line_naming_the_culprit_and_writes_nothing(
    tmp_path: Path,
    write: Callable[[Path], Path],
    cfg: dict[str, Any],
    code: str,
    needles: list[str],
) -> None:
    data = write(tmp_path)
    with pytest.raises(InputError) as info:
        _run(data, tmp_path / "out", **cfg)

    message = str(info.value)
    assert info.value.code == code, message
    assert "\n" not in message
    for needle in needles:
        assert needle in message
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("out")]


def test_cli_exits_2_with_the_error_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pq.write_table(_table(churned=["yes"] * 6), tmp_path / "data.parquet")
    argv = ["preprocess", "--set", "target=churned", "--data", str(tmp_path / "data.parquet")]

    with pytest.raises(SystemExit) as info:
        trainer_main([*argv, "--output", str(tmp_path / "out")])

    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ERROR [preprocess] E_TARGET: target column 'churned' has one class")
    assert not (tmp_path / "out").exists()
