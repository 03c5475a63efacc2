"""Tests for trainer.steps.preprocess.demo_data: a realistic, reproducible, learnable demo table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from trainer.base.errors import InputError
from trainer.steps.preprocess import PreprocessConfig, preprocess
from trainer.steps.preprocess.demo_data import REGIONS, make_demo_table, write_demo_data


@pytest.mark.parametrize(
    ("task", "target", "target_type"),
    [("classification", "churned", pa.string()), ("regression", "spend", pa.float32())],
    ids=["classification", "regression"],
)
def test_table_has_numbers_categories_gaps_and_a_target(
    task: str, target: str, target_type: pa.DataType
) -> None:
    table = make_demo_table(5000, task=task, seed=0)

    assert table.num_rows == 5000
    assert table.column_names[-1] == target and table.schema.field(target).type == target_type
    assert table.column("income").null_count / 5000 == pytest.approx(0.05, abs=0.015)
    assert table.column("device").null_count / 5000 == pytest.approx(0.08, abs=0.015)
    assert table.column(target).null_count == 0
    regions = table.column("region").value_counts().to_pylist()
    assert {r["values"] for r in regions} == set(REGIONS)
    assert min(r["counts"] for r in regions) < 0.01 * 5000  # some regions are rare
    assert set(table.column("plan").to_pylist()) == {"basic", "pro", "enterprise"}


def test_same_seed_same_table_other_seed_other_table() -> None:
    assert make_demo_table(500, seed=4).equals(make_demo_table(500, seed=4))
    assert not make_demo_table(500, seed=4).equals(make_demo_table(500, seed=5))


@pytest.mark.parametrize("name", ["demo.parquet", "demo.csv"], ids=["parquet", "csv"])
def test_write_demo_data_writes_one_file_of_the_right_format(tmp_path: Path, name: str) -> None:
    uri = write_demo_data(str(tmp_path / "sub" / name), rows=300, task="classification", seed=0)

    assert uri == str(tmp_path / "sub" / name)
    # The table and its output marker (a later write may replace the table, nobody else's file).
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == sorted(
        [name, f".{name}.gpupipe-output.json"]
    )
    read = pacsv.read_csv if name.endswith(".csv") else pq.read_table
    assert read(uri).num_rows == 300


def test_churn_is_learnable_but_not_trivially(tmp_path: Path) -> None:
    linear_model = pytest.importorskip("sklearn.linear_model")

    write_demo_data(str(tmp_path / "demo.parquet"), rows=8000, task="classification", seed=0)
    preprocess(
        PreprocessConfig(target="churned"),
        data_uri=str(tmp_path / "demo.parquet"),
        output_uri=str(tmp_path / "out"),
    )
    train = pq.read_table(tmp_path / "out" / "train.parquet").to_pandas()
    val = pq.read_table(tmp_path / "out" / "val.parquet").to_pandas()
    model = linear_model.LogisticRegression(max_iter=500).fit(
        train.drop(columns="churned"), train.churned
    )
    accuracy = model.score(val.drop(columns="churned"), val.churned)
    majority = max(np.mean(val.churned), 1 - np.mean(val.churned))

    assert 0.74 <= accuracy <= 0.88
    assert accuracy > majority + 0.05


@pytest.mark.parametrize(
    ("rows", "task", "needle"),
    [(-1, "classification", "rows"), (10, "clustering", "task")],
    ids=["negative-rows", "unknown-task"],
)
def test_bad_arguments_are_input_errors(rows: int, task: str, needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        make_demo_table(rows, task=task)
