"""Preprocess's column decisions on real public tables (shipped in statsmodels and vega_datasets
wheels): identifiers and constant columns left out, leakage named, dates turned into numbers,
and ``column_roles_json`` overruling each decision."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from trainer.base.errors import InputError
from trainer.base.typedconfig import from_dict
from trainer.steps.preprocess import PreprocessConfig, preprocess
from trainer.steps.preprocess.column_checks import (
    identifier_reason,
    leakage_reason,
    looks_like_id_name,
)

smd = pytest.importorskip("statsmodels.datasets")
vega = pytest.importorskip("vega_datasets")


def fertility(path: Path) -> Path:
    """The World Bank's fertility table (219 countries): 'Country Name' and 'Country Code' are
    unique per row, 'Indicator Name' and 'Indicator Code' are one value; target: 2011's rate."""
    df = smd.fertility.load_pandas().data
    df = df[df["2011"].notna()][["Country Name", "Country Code", "Indicator Name",
                                 "Indicator Code", *map(str, range(1990, 2012))]]  # fmt: skip
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path)
    return path


def seattle_weather(path: Path, *, text_dates: bool) -> Path:
    """Seattle's daily weather 2012-2015 (1461 rows), its 'date' typed or written as text."""
    df = vega.local_data.seattle_weather()
    table = pa.Table.from_pandas(df, preserve_index=False)
    if text_dates:
        pacsv.write_csv(table.set_column(0, "date", table.column("date").cast(pa.date32())),
                        path)  # fmt: skip
    else:
        pq.write_table(table, path)
    return path


def run(tmp: Path, data: Path, target: str, **cfg: Any) -> tuple[dict, list[str]]:
    config = from_dict(PreprocessConfig, {"target": target, **cfg})
    result = preprocess(config, data_uri=str(data), output_uri=str(tmp / "out"))
    return json.loads((tmp / "out" / "schema.json").read_text()), result.notices


def by_column(schema: dict) -> dict[str, dict]:
    return {d["column"]: d for d in schema["decisions"]}


def test_identifiers_and_constant_columns_are_left_out_with_a_warning_naming_them(
    tmp_path: Path,
) -> None:
    schema, notices = run(tmp_path, fertility(tmp_path / "f.parquet"), "2011")
    decided = by_column(schema)
    for name in ("Country Name", "Country Code"):
        assert decided[name]["action"] == "dropped" and decided[name]["reason"] == "identifier"
        assert any(n.startswith("WARNING [preprocess] W_IDENTIFIER: column " + repr(name))
                   for n in notices), notices  # fmt: skip
    for name in ("Indicator Name", "Indicator Code"):
        assert decided[name]["reason"] == "constant"
        assert any(f"W_CONSTANT: column {name!r}" in n for n in notices)
    assert not any(f.startswith(("Country", "Indicator")) for f in schema["features"])
    assert "1990" in schema["features"]
    assert """column_roles_json={"Country Name": "keep"}""" in " ".join(notices)
    assert set(schema["dropped"]) >= {"Country Name", "Indicator Code"}
    assert schema["warnings"] and all(w.startswith("WARNING") for w in schema["warnings"])


def test_keep_overrules_the_identifier_and_constant_decisions(tmp_path: Path) -> None:
    roles = {"Country Code": "keep", "Indicator Name": "keep"}
    schema, _ = run(tmp_path, fertility(tmp_path / "f.parquet"), "2011", column_roles=roles)
    decided = by_column(schema)
    assert "Country Code" not in decided and "Indicator Name" not in decided
    assert any(f.startswith("Country Code=") for f in schema["features"])
    assert any(f.startswith("Indicator Name=") for f in schema["features"])
    assert decided["Country Name"]["reason"] == "identifier"  # not named: still decided


def test_a_column_identical_to_the_target_is_named_in_a_warning_and_kept(tmp_path: Path) -> None:
    data = fertility(tmp_path / "f.parquet")
    table = pq.read_table(data)
    pq.write_table(table.append_column("rate_reported", table.column("2011")), data)
    schema, notices = run(tmp_path, data, "2011")
    leak = by_column(schema)["rate_reported"]
    assert (leak["action"], leak["reason"], leak["detail"]) == (
        "warning", "leakage", "identical to the target"
    )  # fmt: skip
    (line,) = [n for n in notices if "W_LEAKAGE" in n]
    assert "column 'rate_reported' predicts target '2011' perfectly" in line
    assert """column_roles_json={"rate_reported": "drop"}""" in line
    assert "rate_reported" in schema["features"], "the user decides: the run goes on"
    assert "2010" not in by_column(schema), "close to the target is not leakage"


@pytest.mark.parametrize("text_dates", [False, True], ids=["parquet-timestamp", "csv-text"])
def test_date_columns_become_year_month_day_weekday_and_elapsed_days(
    tmp_path: Path, text_dates: bool
) -> None:
    name = "w.csv" if text_dates else "w.parquet"
    schema, _ = run(tmp_path, seattle_weather(tmp_path / name, text_dates=text_dates),
                          "weather")  # fmt: skip
    parts = ["date__year", "date__month", "date__day", "date__weekday", "date__elapsed_days"]
    assert [f for f in schema["features"] if f.startswith("date")] == parts
    assert by_column(schema)["date"]["action"] == "date"
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())["columns"]
    assert (stats["date__year"]["min"], stats["date__year"]["max"]) == (2012, 2015)
    assert stats["date__month"]["max"] == 12 and stats["date__weekday"]["max"] == 6


def test_declared_roles_overrule_dates_and_a_bad_date_is_one_line(tmp_path: Path) -> None:
    data = seattle_weather(tmp_path / "w.csv", text_dates=True)
    schema, _ = run(tmp_path, data, "weather", column_roles={"date": "drop"})
    assert not any(f.startswith("date") for f in schema["features"])
    with pytest.raises(InputError) as info:
        run(tmp_path, data, "weather", column_roles={"weather": "date"}, task="auto")
    assert info.value.code == "E_CONFIG"
    with pytest.raises(InputError) as info:
        run(tmp_path, data, "temp_max", column_roles={"weather": "date"})
    assert info.value.code == "E_SCHEMA"
    assert "'weather' is declared a date" in str(info.value) and "'drizzle'" in str(info.value)
    assert "\n" not in str(info.value)


def test_an_unknown_role_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"column_roles\.id.*must be one of numeric, categorical"):
        from_dict(PreprocessConfig, {"target": "y", "column_roles": {"id": "identifier"}})


@pytest.mark.parametrize(
    ("name", "values", "expected"),
    [
        ("customer_id", np.arange(100) * 7919 % 100003, True),
        ("row", np.arange(100), True),
        ("income", np.arange(100) * 7919 % 100003, False),  # unique, sparse, not named a key
    ],
    ids=["named-key", "row-number", "unique-measurement"],
)
def test_integer_identifiers_need_a_key_name_or_consecutive_values(
    name: str, values: np.ndarray, expected: bool
) -> None:
    got = identifier_reason(name, distinct=100, rows=100, missing=0, integers=values.astype(float))
    assert (got is not None) == expected


def test_small_tables_and_repeating_values_are_never_called_identifiers_or_leakage() -> None:
    assert identifier_reason("id", distinct=10, rows=10, missing=0, integers=None) is None
    x = np.repeat(np.arange(10.0), 5)
    y = np.tile([0, 1], 25)
    assert leakage_reason(numbers=x, codes=None, y=y, classification=True) is None
    assert looks_like_id_name("CustomerID") and looks_like_id_name("user_key")
    assert not looks_like_id_name("width") and not looks_like_id_name("paid")
