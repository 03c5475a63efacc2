"""Odd tables a new user tries (issue 39, item 1): the pre-check of ``gpupipe run --local``
(:func:`pipelines.local_checks.check_data`) and the preprocess step say one line about each, or
read it.

Each case goes through both, as a run does: the pre-check first, then the step itself.
"""

from __future__ import annotations

import ast
import decimal
import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.local_checks import check_data
from pipelines.params import preprocess_config, with_defaults
from trainer.base.errors import InputError, error_line
from trainer.steps.preprocess import PreprocessResult, preprocess

ROWS = 60
REPO = Path(__file__).resolve().parents[2]


def _both(path: Path, target: str, tmp_path: Path, capsys: Any) -> tuple[str, PreprocessResult]:
    """Pre-check then preprocess ``path``; returns the pre-check's notes and the result."""
    params = with_defaults({"target": target})
    check_data(str(path), target, params)
    notes = capsys.readouterr().err
    result = preprocess(
        preprocess_config(params), data_uri=str(path), output_uri=str(tmp_path / "out")
    )
    return notes, result


def _refused(path: Path, target: str, tmp_path: Path) -> tuple[InputError, InputError]:
    """The pre-check's and preprocess's refusals of ``path``; nothing is written."""
    params = with_defaults({"target": target})
    with pytest.raises(InputError) as pre:
        check_data(str(path), target, params)
    out = tmp_path / "out"
    with pytest.raises(InputError) as step:
        preprocess(preprocess_config(params), data_uri=str(path), output_uri=str(out))
    assert not out.exists()
    return pre.value, step.value


def _parquet(tmp_path: Path, table: pa.Table, name: str = "t.parquet") -> Path:
    path = tmp_path / name
    pq.write_table(table, path)
    return path


def _labels() -> pa.Array:
    return pa.array(np.arange(ROWS) % 2)


def test_parquet_with_columns_and_no_rows_says_no_rows(tmp_path: Path) -> None:
    table = pa.table({"x": pa.array([], pa.float64()), "y": pa.array([], pa.int64())})
    pre, step = _refused(_parquet(tmp_path, table), "y", tmp_path)
    for e in (pre, step):
        assert e.code == "E_EMPTY" and "no rows" in e.message, e


def test_header_only_csv_says_no_rows(tmp_path: Path) -> None:
    path = tmp_path / "h.csv"
    path.write_text("x,y\n")
    pre, step = _refused(path, "y", tmp_path)
    for e in (pre, step):
        assert e.code == "E_EMPTY" and "no rows" in e.message and "null" not in e.message, e


def test_duplicate_column_names_in_parquet_are_named(tmp_path: Path) -> None:
    x = pa.array(np.arange(ROWS, dtype=float))
    table = pa.Table.from_arrays([x, x, _labels()], names=["x", "x", "y"])
    pre, step = _refused(_parquet(tmp_path, table), "y", tmp_path)
    for e in (pre, step):
        assert e.code == "E_SCHEMA" and "column name 'x' appears 2 times" in e.message


def test_regression_target_near_float32_max_is_refused_naming_the_row(tmp_path: Path) -> None:
    table = pa.table({"x": np.arange(ROWS, dtype=float), "y": np.linspace(1e38, 3e38, ROWS)})
    pre, step = _refused(_parquet(tmp_path, table), "y", tmp_path)
    for e in (pre, step):
        assert e.code == "E_OVERFLOW" and "regression target 'y'" in e.message
        assert e.where.endswith("row 1")


def test_constant_regression_target_is_refused_like_one_class(tmp_path: Path) -> None:
    table = pa.table({"x": np.arange(ROWS, dtype=float), "y": np.full(ROWS, 2.5)})
    pre, step = _refused(_parquet(tmp_path, table), "y", tmp_path)
    for e in (pre, step):
        assert e.code == "E_TARGET" and "one value (2.5) in every row" in e.message


def _csv_frame() -> pd.DataFrame:
    return pd.DataFrame({"x": np.arange(ROWS, dtype=float), "y": np.arange(ROWS) % 2})


@pytest.mark.parametrize("name", ["t.csv.gz", "t.csv"], ids=["named-gz", "gzip-named-csv"])
def test_gzip_compressed_csv_is_read(tmp_path: Path, capsys: Any, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(gzip.compress(_csv_frame().to_csv(index=False).encode()))
    _, result = _both(path, "y", tmp_path, capsys)
    assert result.features == ["x"] and result.classes == ["0", "1"]


def test_gzip_csv_in_a_folder_is_a_data_file(tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "part.csv.gz").write_bytes(gzip.compress(_csv_frame().to_csv(index=False).encode()))
    _, result = _both(folder, "y", tmp_path, capsys)
    assert result.train_rows + result.val_rows + result.test_rows == ROWS


def test_a_message_quoting_binary_bytes_prints_no_control_characters() -> None:
    line = error_line("preprocess", InputError("E_CSV", "bad line 'a\x00b\x1b[2J'", "f.csv"))
    assert line.isprintable() and "\\x00" in line and "\\x1b" in line


@pytest.mark.parametrize(
    "make",
    [
        lambda a: pa.array([decimal.Decimal(f"{i}.25") for i in a], pa.decimal128(10, 2)),
        lambda a: pa.array([decimal.Decimal(f"{i}.5") for i in a], pa.decimal256(40, 1)),
    ],
    ids=["decimal128", "decimal256"],
)
def test_parquet_decimals_are_numbers(
    tmp_path: Path, capsys: Any, make: Callable[[np.ndarray], pa.Array]
) -> None:
    values = make(np.arange(ROWS))
    _, result = _both(
        _parquet(tmp_path, pa.table({"x": values, "y": _labels()})), "y", tmp_path, capsys
    )
    assert result.features == ["x"]
    # ... and as a target: a regression on the decimal values
    table = pa.table({"x": np.random.default_rng(0).normal(size=ROWS), "y": values})
    _, result = _both(_parquet(tmp_path, table, "t2.parquet"), "y", tmp_path / "2", capsys)
    assert result.task == "regression"


def test_date_note_names_hour_for_time_zone_aware_timestamps(tmp_path: Path, capsys: Any) -> None:
    times = pd.date_range("2024-01-01 03:00", periods=ROWS, freq="7h", tz="Europe/Berlin")
    table = pa.table({"t": pa.array(times), "y": _labels()})
    notes, result = _both(_parquet(tmp_path, table), "y", tmp_path, capsys)
    assert "t__hour" in result.features
    note = next(line for line in notes.splitlines() if "I_DATE" in line)
    assert "t__hour" in note, note


def test_boolean_target_is_not_called_text_labels(tmp_path: Path, capsys: Any) -> None:
    y = pa.array([i % 3 == 0 for i in range(ROWS)])
    table = pa.table({"x": np.arange(ROWS, dtype=float), "y": y})
    notes, result = _both(_parquet(tmp_path, table), "y", tmp_path, capsys)
    assert result.classes == ["false", "true"]
    task = next(n for n in result.notices if "I_TASK" in n)
    assert "true/false labels" in task and "text labels" not in task
    assert "text labels" not in notes


def test_wrong_case_target_gets_did_you_mean(tmp_path: Path) -> None:
    table = pa.table({"x": np.arange(ROWS, dtype=float), "Churned": _labels()})
    pre, step = _refused(_parquet(tmp_path, table), "churned", tmp_path)
    assert "did you mean 'Churned'? set --target Churned" in pre.message
    assert "did you mean 'Churned'?" in step.message


def test_empty_target_flag_is_named_not_called_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = pa.table({"x": np.arange(ROWS, dtype=float), "": _labels()})
    path = _parquet(tmp_path, table)
    root = tmp_path / "root"
    code = main(["run", "--local", "--root", str(root), "--data", str(path), "--target", ""])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2
    assert err.startswith("ERROR [gpupipe run] E_PARAM: --target must name a column, got ''")
    assert "--target is required" not in err
    assert not root.exists()


def test_arrow_readers_over_bytes_go_through_arrow_owned_memory() -> None:
    """A ``pa.BufferReader`` over Python ``bytes`` in a threaded read can be released by a pool
    thread after interpreter shutdown began: ``terminate called without an active exception``,
    exit 134, after the step's own error line (5 rows x 10,000 columns did it). Every reader of
    a data file's bytes goes through ``tabular._reader`` (a copy in Arrow's memory)."""
    steps = REPO / "trainer" / "steps"
    offenders = []
    for path in sorted(steps.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "BufferReader"
            ):
                offenders.append(f"{path.relative_to(steps).as_posix()}:{node.lineno}")
    assert offenders == [f"{TABULAR}:{_reader_line()}"], offenders


TABULAR = "preprocess/tabular.py"
"""The one module of trainer/steps that reads a data file's bytes."""


def _reader_line() -> int:
    source = (REPO / "trainer" / "steps" / TABULAR).read_text()
    return next(
        i for i, line in enumerate(source.splitlines(), 1) if "pa.BufferReader(buf)" in line
    )


def test_integers_beyond_float64s_exact_range_are_read_as_numbers(
    tmp_path: Path, capsys: Any
) -> None:
    """An integer column past 2**53 (found by the table search in CI: a traceback from a safe
    cast to float64) is read as the nearest float64, like any numeric library reads it."""
    big = pa.array([2**53 + 1 + i for i in range(ROWS)], pa.int64())
    path = _parquet(tmp_path, pa.table({"id_like": big, "y": _labels()}))
    _, result = _both(path, "y", tmp_path, capsys)
    assert (tmp_path / "out" / "schema.json").exists()
    assert result is not None
