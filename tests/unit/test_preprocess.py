"""Tests for trainer.steps.preprocess: outputs, splits, train-only fits, determinism, bad input."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from pipelines.params import preprocess_config, with_defaults
from trainer.__main__ import main as trainer_main
from trainer.base.errors import InputError
from trainer.base.outputs import OUTPUT_MARKER
from trainer.base.typedconfig import from_dict
from trainer.data.datasets import TabularDataset
from trainer.steps.preprocess import PreprocessConfig, PreprocessResult, make_demo_table, preprocess
from trainer.steps.preprocess.step import display_uri
from trainer.steps.preprocess.tabular import split_indices


def from_params(**params: Any) -> PreprocessConfig:
    """The config the preprocess component makes of these pipeline parameters (the others at
    the pipeline's defaults)."""
    return preprocess_config(with_defaults(params))  # type: ignore[no-any-return]


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
            # Roles override inference for the columns they name; the rest are still inferred.
            {"column_roles": {"age": "numeric", "plan": "categorical", "region": "drop"}},
            ["age", "plan=pro", "income", "device=ios"],
            ["region=north"],
        ),
        (
            {"column_roles": {"support_calls": "categorical"}},
            ["support_calls=0", "age"],
            ["support_calls"],
        ),
    ],
    ids=["indicator", "no-indicator", "declared-roles", "declared-categorical-number"],
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
    table = pa.table({"x": np.arange(24.0), "churned": ["yes", "no"] * 12, "v": values * 4})
    _run(_write_parquet_file(tmp_path, table), tmp_path / "out")

    schema = json.loads((tmp_path / "out" / "schema.json").read_text())
    assert {c["name"]: c["kind"] for c in schema["columns"]}["v"] == kind


# --- CSV options and pipeline parameters ---------------------------------------------------

_CSV_ROWS = [
    (f"{i * 1.5}", "red" if i % 3 else "blue", "yes" if i % 2 else "no") for i in range(40)
]


def _text(sep: str, *, header: bool = True, missing: str = "") -> str:
    lines = [sep.join(("x", "colour", "churned"))] if header else []
    for i, row in enumerate(_CSV_ROWS):
        x = missing if missing and i == 7 else row[0]
        lines.append(sep.join((x, *row[1:])))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("name", "text", "encoding", "params"),
    [
        ("data.csv", _text(";"), "utf-8", {"csv_delimiter": ";"}),
        ("data.tsv", _text("\t"), "utf-8", {}),  # auto: a tab for .tsv
        ("data.txt", _text("\t"), "utf-8", {"csv_delimiter": "tab"}),
        ("data.csv", _text(",").replace("red", "rød"), "latin-1", {"csv_encoding": "latin-1"}),
        ("data.csv", _text(",", missing="?"), "utf-8", {"csv_null_values": "?, -"}),
        (
            "data.csv",
            _text(",", header=False),
            "utf-8",
            {"csv_header": False, "target": "column_3"},
        ),
    ],
    ids=["semicolon", "tsv-auto", "tab-word", "latin-1", "null-values", "no-header"],
)
def test_csv_options_read_what_the_defaults_cannot(
    tmp_path: Path, name: str, text: str, encoding: str, params: dict[str, Any]
) -> None:
    (tmp_path / name).write_bytes(text.encode(encoding))
    target = params.pop("target", "churned")
    cfg = from_params(target=target, **params)

    result = preprocess(cfg, data_uri=str(tmp_path / name), output_uri=str(tmp_path / "out"))

    assert result.train_rows + result.val_rows + result.test_rows == len(_CSV_ROWS)
    schema = json.loads((tmp_path / "out" / "schema.json").read_text())
    kinds = {c["name"]: c["kind"] for c in schema["columns"]}
    assert list(kinds.values()) == ["numeric", "categorical"], kinds
    if "csv_null_values" in params:
        assert schema["columns"][0]["missing"] == 1


def test_pipeline_parameters_become_the_config() -> None:
    cfg = from_params(
        target="y",
        task="regression",
        seed=3,
        column_roles_json='{"zip": "categorical", "id": "drop"}',
        csv_delimiter="|",
        csv_header=False,
        csv_encoding="cp1252",
        csv_null_values="?, n.a.",
        preprocess_config_json='{"val_fraction": 0.2, "column_roles.age": "numeric"}',
    )

    assert cfg.column_roles == {"zip": "categorical", "id": "drop", "age": "numeric"}
    assert (cfg.csv_delimiter, cfg.csv_header, cfg.csv_encoding) == ("|", False, "cp1252")
    assert cfg.csv_null_values == ["?", "n.a."]
    assert (cfg.val_fraction, cfg.seed, cfg.task) == (0.2, 3, "regression")


@pytest.mark.parametrize(
    ("params", "code", "needles"),
    [
        ({"column_roles_json": "{zip: categorical}"}, "E_PARAM", ["column_roles_json", "JSON"]),
        ({"column_roles_json": '["zip"]'}, "E_PARAM", ["column_roles_json", "JSON object"]),
        ({"column_roles_json": '{"zip": "text"}'}, "E_CONFIG", ["column_roles.zip", "'text'"]),
        ({"column_roles_json": '{"y": "numeric"}'}, "E_CONFIG", ["column_roles.y", "target"]),
        ({"preprocess_config_json": "[1]"}, "E_PARAM", ["preprocess_config_json"]),
        ({"preprocess_config_json": '{"val_fractio": 0.2}'}, "E_CONFIG", ["val_fractio"]),
        (
            {"preprocess_config_json": '{"test_fraction": 0}'},
            "E_CONFIG",
            ["test_fraction", "(0, 1)"],
        ),
        ({"csv_delimiter": ";;"}, "E_CONFIG", ["csv_delimiter", "';;'"]),
        ({"csv_delimiter": '"'}, "E_CONFIG", ["csv_delimiter"]),
        ({"csv_encoding": "utf-9"}, "E_CONFIG", ["csv_encoding", "'utf-9'"]),
    ],
    ids=[
        "roles-not-json",
        "roles-not-object",
        "unknown-role",
        "role-for-target",
        "config-not-object",
        "config-unknown-key",
        "no-test-split",
        "long-delimiter",
        "quote-delimiter",
        "unknown-encoding",
    ],
)
def test_bad_pipeline_parameters_name_the_parameter(
    params: dict[str, Any], code: str, needles: list[str]
) -> None:
    with pytest.raises(InputError) as info:
        from_params(target="y", **params)

    assert info.value.code == code, str(info.value)
    for needle in needles:
        assert needle in str(info.value)


# --- bad input ------------------------------------------------------------------------------


def _table(**columns: Any) -> pa.Table:
    base: dict[str, Any] = {"x": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "churned": ["yes", "no"] * 3}
    return pa.table({**base, **columns})


def _big(n: int = 40, **columns: Any) -> pa.Table:
    """A table large enough to split: ``columns`` are repeated to ``n`` rows."""
    base: dict[str, Any] = {
        "x": np.arange(n, dtype=np.float64),
        "churned": ["yes", "no"] * (n // 2),
    }
    base.update({k: (v * n)[:n] for k, v in columns.items()})
    return pa.table(base)


def _csv(text: str | bytes, name: str = "data.csv") -> Callable[[Path], Path]:
    def write(tmp: Path) -> Path:
        (tmp / name).write_bytes(text.encode() if isinstance(text, str) else text)
        return tmp / name

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


def _mixed_schemas(tmp: Path) -> Path:
    """A CSV and a Parquet file whose column ``x`` cannot be one type."""
    (tmp / "data").mkdir()
    (tmp / "data" / "a.csv").write_text("x,churned\n1,yes\n2,no\n")
    table = pa.table({"x": pa.array([b"\x00\x01", b"\x02"]), "churned": ["yes", "no"]})
    pq.write_table(table, tmp / "data" / "b.parquet")
    return tmp / "data"


def _duplicate_parquet_columns(tmp: Path) -> Path:
    arrays = [pa.array([1.0, 2.0] * 20), pa.array([3.0, 4.0] * 20), pa.array(["yes", "no"] * 20)]
    pq.write_table(pa.Table.from_arrays(arrays, names=["a", "a", "churned"]), tmp / "dup.parquet")
    return tmp / "dup.parquet"


def _rows(*rows: str, header: str = "x,churned") -> str:
    return "\n".join([header, *rows]) + "\n"


_NUMBERS_THEN_A_WORD = _rows("1.5,yes", "2.5,no", "3.5,yes", "abc,no", "4.5,yes", "5.5,no")
_TINY_STD = np.zeros(40)
_TINY_STD[::2] = 1e-30
# 1e10 in a validation row (seed 0): standardised with train's std 5e-31 it overflows float32.
_, _VAL_ROWS, _ = split_indices(
    40, classes=np.array([1, 0] * 20), val_fraction=0.15, test_fraction=0.15, seed=0
)
_VAL_ROW = int(_VAL_ROWS[0])
_TINY_STD[_VAL_ROW] = 1e10
_RARE = _big(40).append_column("x2", pa.array(np.ones(40))).slice(0, 39)
_RARE = pa.concat_tables([_RARE, pa.table({"x": [1.0], "churned": ["rare"], "x2": [1.0]})])

BAD_INPUTS = [
    ("missing-file", lambda tmp: tmp / "nope.parquet", {}, "E_DATA", ["nope.parquet", "not found"]),
    ("no-data-files", _empty_folder, {}, "E_DATA", ["no data files"]),
    ("empty-csv", _csv("x,churned\n"), {}, "E_EMPTY", ["no rows", "data.csv"]),
    ("empty-file", _csv(""), {}, "E_EMPTY", ["data.csv"]),
    ("empty-parquet-table", _parquet(_table().slice(0, 0)), {}, "E_EMPTY", ["no rows"]),
    ("zero-byte-parquet", _csv(b"", "data.parquet"), {}, "E_EMPTY", ["data.parquet", "0 bytes"]),
    (
        "not-parquet",
        _csv("x,churned\n1,yes\n", "data.parquet"),
        {},
        "E_DATA",
        ["data.parquet", "not Parquet"],
    ),
    (
        "truncated-parquet",
        lambda tmp: _csv(_write_parquet_file(tmp, _big()).read_bytes()[:-20], "data.parquet")(tmp),
        {},
        "E_DATA",
        ["data.parquet", "cannot read Parquet"],
    ),
    (
        "duplicate-csv-columns",
        _csv(_rows("1,2,yes", "3,4,no", header="a,a,churned")),
        {},
        "E_SCHEMA",
        ["'a' appears 2 times", "data.csv"],
    ),
    (
        "duplicate-parquet-columns",
        _duplicate_parquet_columns,
        {},
        "E_SCHEMA",
        ["'a' appears 2 times", "dup.parquet"],
    ),
    (
        "not-utf8-csv",
        _csv(b"x,city,churned\n1,Bonn,yes\n2,K\xf6ln,no\n"),
        {},
        "E_ENCODING",
        ["line 3", "0xf6", "--param csv_encoding=latin-1", "data.csv"],
    ),
    (
        "wrong-field-count",
        _csv(_rows("1,yes", "2,no,extra", "3,yes")),
        {},
        "E_CSV",
        ["line 3", "expected 2 fields", "'2,no,extra'", "csv_delimiter", "data.csv"],
    ),
    (
        # (";" alone is read as meant under csv_delimiter=auto: tests/unit/test_file_kinds.py)
        "wrong-delimiter",
        _csv(_rows("1|yes", "2|no", header="x|churned")),
        {},
        "E_COLUMN",
        ["'churned' not found", "--param 'csv_delimiter=|'", "data.csv"],
    ),
    (
        "mixed-schemas",
        _mixed_schemas,
        {},
        "E_SCHEMA",
        ["type of column 'x'", "b.parquet", "a.csv", "column_roles_json"],
    ),
    (
        "missing-target",
        _parquet(_table().drop_columns(["churned"])),
        {},
        "E_COLUMN",
        ["'churned'", "columns: x", "--param target="],
    ),
    (
        "misspelt-target",
        _parquet(_table()),
        {"target": "churn"},
        "E_COLUMN",
        ["'churn' not found", "did you mean 'churned'", "--param target=churned"],
    ),
    (
        "one-class",
        _parquet(_table(churned=["yes"] * 6)),
        {},
        "E_TARGET",
        ["one class", "'yes'", "--param target"],
    ),
    (
        "target-missing-value",
        _parquet(_table(churned=["yes", "no", None, "no", "yes", "no"])),
        {},
        "E_TARGET",
        ["'churned'", "row 3"],
    ),
    (
        "text-regression-target",
        _parquet(_big()),
        {"task": "regression"},
        "E_TARGET",
        ["'churned'", "--param task=classification"],
    ),
    (
        "all-missing-column",
        _parquet(_table(notes=pa.nulls(6, pa.string()))),
        {},
        "E_ALL_MISSING",
        ["'notes'", """--param 'column_roles_json={"notes": "drop"}'"""],
    ),
    (
        "all-nan-column",
        _parquet(_table(x=[float("nan")] * 6)),
        {},
        "E_ALL_MISSING",
        ["'x'", "column_roles_json"],
    ),
    (
        "unsupported-type",
        _parquet(_big(when=[np.timedelta64(5, "s")])),
        {},
        "E_SCHEMA",
        ["'when'", "duration", """--param 'column_roles_json={"when": "drop"}'"""],
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
        "huge-value",
        _parquet(_big(x=[1.0, 2.0, 1e300, 4.0])),
        {},
        "E_OVERFLOW",
        ["'x'", "1e+300", "float32", "data.parquet row 3"],
    ),
    (
        "huge-regression-target",
        _parquet(pa.table({"x": np.arange(40.0), "y": np.r_[np.arange(39.0), 1e39]})),
        {"target": "y"},
        "E_OVERFLOW",
        ["'y'", "1e+39", "data.parquet row 40"],
    ),
    (
        "overflow-after-scaling",
        _parquet(_big(x=list(_TINY_STD))),
        {},
        "E_OVERFLOW",
        ["'x'", "1e+10", "standardised", f"data.parquet row {_VAL_ROW + 1}"],
    ),
    (
        "mixed-types-csv",
        _csv(_NUMBERS_THEN_A_WORD),
        {},
        "E_MIXED_TYPES",
        ["'x'", "'abc'", "data.csv line 5", "column_roles_json", "csv_null_values=abc"],
    ),
    (
        "declared-column-absent",
        _parquet(_table()),
        {"column_roles": {"x": "numeric", "ghost": "categorical"}},
        "E_SCHEMA",
        ["'ghost'", "not in the data", "column_roles_json"],
    ),
    (
        "declared-numeric-holds-text",
        _parquet(_table(plan=["basic", "pro"] * 3)),
        {"column_roles": {"plan": "numeric"}},
        "E_SCHEMA",
        ["'plan'", "'basic'", "row 1", """{"plan": "categorical"}"""],
    ),
    (
        "every-feature-dropped",
        _parquet(_table()),
        {"column_roles": {"x": "drop"}},
        "E_SCHEMA",
        ["no feature columns", """{"x": "numeric"}"""],
    ),
    (
        "empty-validation-and-test",
        _parquet(_table()),
        {},
        "E_SPLIT",
        # No advice to raise the shares: on 6 rows that leads to a test split of one row,
        # too small to gate on (trainer.steps.evaluate.gate.MIN_GATE_ROWS).
        ["validation and test splits are empty", "add rows (", "data.parquet"],
    ),
    (
        "empty-training-split",
        _parquet(pa.table({"x": [1.0, 2.0, 3.0], "y": [0.5, 1.5, 2.5]})),
        {"target": "y", "val_fraction": 0.5, "test_fraction": 0.45},
        "E_SPLIT",
        ["training split is empty", "preprocess_config_json"],
    ),
    (
        "class-missing-from-training",
        _parquet(_RARE),
        {"test_fraction": 0.6},
        "E_SPLIT",
        ["class 'rare'", "1 row", "preprocess_config_json"],
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
        "unknown-column-role",
        _parquet(_table()),
        {"column_roles": {"x": "text"}},
        "E_CONFIG",
        ["column_roles.x", "'text'"],
    ),
]
_INTERNAL = re.compile(r"\b(train|val|test)\.parquet\b|schema\.json")


@pytest.mark.parametrize(
    ("write", "cfg", "code", "needles"),
    [case[1:] for case in BAD_INPUTS],
    ids=[case[0] for case in BAD_INPUTS],
)
def test_bad_input_exits_2_with_one_line_naming_the_culprit_and_writes_nothing(
    tmp_path: Path,
    write: Callable[[Path], Path],
    cfg: dict[str, Any],
    code: str,
    needles: list[str],
) -> None:
    data = write(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"target": "churned", **cfg}))
    out = tmp_path / "out"
    argv = ["--config", str(tmp_path / "config.json"), "--data", str(data), "--output", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "preprocess", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr  # no traceback, no warning
    assert lines[0].startswith(f"ERROR [preprocess] {code}: "), lines[0]
    for needle in needles:
        assert needle in lines[0]
    assert not _INTERNAL.search(lines[0]), f"names an internal file: {lines[0]}"
    assert proc.stdout == ""
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("out")]


# --- the advice works -----------------------------------------------------------------------

_PARAM = re.compile(r"--param ('[^']*'|[^\s,;]+)")


def _advised(message: str) -> list[dict[str, Any]]:
    """Each ``--param name=value`` the message advises, as pipeline parameters."""
    out = []
    for match in _PARAM.finditer(message):
        (pair,) = shlex.split(match.group(1))
        name, _, value = pair.partition("=")
        typed: Any = int(value) if name == "seed" else value
        out.append({name: typed})
    return out


ADVICE_CASES = [
    (
        "wrong-delimiter",
        # x repeats (i % 13): a column unique per row would be left out as an identifier
        _csv(
            _rows(*[f"{i % 13}|{'yes' if i % 2 else 'no'}" for i in range(40)], header="x|churned")
        ),
    ),
    (
        "not-utf8",
        _csv(
            b"x,city,churned\n"
            + b"".join(b"%d,K\xf6ln,%s\n" % (i % 13, b"yes" if i % 2 else b"no") for i in range(40))
        ),
    ),
    ("mixed-types", _csv(_rows(*[f"{i},{'yes' if i % 2 else 'no'}" for i in range(39)], "?,no"))),
    ("all-missing", _parquet(_big(notes=pa.nulls(40, pa.string()).to_pylist()))),
    ("unsupported-type", _parquet(_big(when=[np.timedelta64(5, "s")]))),
    ("huge-value", _parquet(_big(big=[1.0, 2.0, 1e300, 4.0]))),
    ("overflow-after-scaling", _parquet(_big(tiny=list(_TINY_STD)))),
    ("declared-numeric-text", _parquet(_big(plan=["basic", "pro"]))),
    # (6 rows, empty held-out splits: no share advice any more, since it only leads to a
    # one-row test split that the gate refuses; the message says to add rows.)
    ("class-missing-from-training", _parquet(_RARE)),
]
_ADVICE_CONFIG = {
    "declared-numeric-text": {"column_roles_json": '{"plan": "numeric"}'},
    "class-missing-from-training": {"preprocess_config_json": '{"test_fraction": 0.6}'},
}


@pytest.mark.parametrize("write", [c[1] for c in ADVICE_CASES], ids=[c[0] for c in ADVICE_CASES])
def test_following_each_advised_parameter_fixes_the_run(
    tmp_path: Path, request: pytest.FixtureRequest, write: Callable[[Path], Path]
) -> None:
    data = str(write(tmp_path))
    base = _ADVICE_CONFIG.get(request.node.callspec.id, {})
    with pytest.raises(InputError) as info:
        preprocess(
            from_params(target="churned", **base),
            data_uri=data,
            output_uri=str(tmp_path / "out"),
        )
    advice = _advised(info.value.message)
    assert advice, f"no --param advice in: {info.value}"

    for i, param in enumerate(advice):  # each alternative on its own fixes the run
        cfg = from_params(target="churned", **{**base, **param})
        result = preprocess(cfg, data_uri=data, output_uri=str(tmp_path / f"fixed-{i}"))
        assert result.train_rows > 0 and result.val_rows > 0 and result.test_rows > 0, param


def test_cli_exits_2_with_the_error_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pq.write_table(_table(churned=["yes"] * 6), tmp_path / "data.parquet")
    argv = ["preprocess", "--set", "target=churned", "--data", str(tmp_path / "data.parquet")]

    with pytest.raises(SystemExit) as info:
        trainer_main([*argv, "--output", str(tmp_path / "out")])

    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ERROR [preprocess] E_TARGET: target column 'churned' has one class")
    assert not (tmp_path / "out").exists()


def test_schema_records_the_source_without_credentials(tmp_path: Path, demo: pa.Table) -> None:
    _run(_write_parquet_file(tmp_path, demo), tmp_path / "out")

    schema = json.loads((tmp_path / "out" / "schema.json").read_text())
    assert schema["source"] == str(tmp_path / "data.parquet")
    assert display_uri("s3://AKIAKEY:s3cr3t@bucket/data.csv") == "s3://bucket/data.csv"


def test_train_names_the_users_data_and_batch_size_when_the_split_is_smaller_than_a_batch(
    tmp_path: Path,
) -> None:
    data = _write_parquet_file(tmp_path, _big(40))
    _run(data, tmp_path / "dataset")  # 28 training rows
    argv = ["--dataset", str(tmp_path / "dataset"), "--model", str(tmp_path / "model")]
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "train", *argv, "--set", "train.global_batch_size=64"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("ERROR [train] E_CONFIG: batch_size 64"), line
    assert str(data) in line and "(28 rows)" in line and "--param batch_size=16" in line
    assert not _INTERNAL.search(line), line
    assert not (tmp_path / "model").exists()
