"""``gpupipe run --local`` on a real public table with an identifier, constant columns, a date
and a column that leaks the target: the decisions reach schema.json, the summary and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.integration.test_local_pipeline import EPOCHS, RUN_TIMEOUT_S, gpupipe

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(RUN_TIMEOUT_S + 120)]
smd = pytest.importorskip("statsmodels.datasets")


def test_a_real_table_s_column_decisions_reach_schema_summary_and_report(tmp_path: Path) -> None:
    # The World Bank's fertility table as shipped in statsmodels (202 countries with a 2011
    # rate): 'Country Name'/'Country Code' are unique per row, 'Indicator *' one value. Added:
    # the rate copied under another name (leakage) and a date column written as text.
    df = smd.fertility.load_pandas().data
    df = df[df["2011"].notna()][["Country Name", "Country Code", "Indicator Name",
                                 "Indicator Code", *map(str, range(1995, 2012))]]  # fmt: skip
    table = pa.Table.from_pandas(df, preserve_index=False)
    table = table.append_column("rate_reported", table.column("2011"))
    dates = [f"2013-{1 + i % 12:02d}-{1 + i % 28:02d}" for i in range(table.num_rows)]
    table = table.append_column("published", pa.array(dates))
    data = tmp_path / "fertility.parquet"
    pq.write_table(table, data)
    root = tmp_path / "root"
    argv = ["run", "--local", "--json", "--root", str(root), "--data", str(data)]
    argv += ["--target", "2011", "--param", f"epochs={EPOCHS}"]
    argv += ["--param", 'column_roles_json={"Indicator Code": "keep"}']
    result = gpupipe(*argv, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    warned = " ".join(summary["data_warnings"])
    expected = [("W_IDENTIFIER", "Country Name"), ("W_IDENTIFIER", "Country Code"),
                ("W_CONSTANT", "Indicator Name"), ("W_LEAKAGE", "rate_reported")]  # fmt: skip
    for code, name in expected:
        assert f"{code}: column {name!r}" in warned, warned
    assert "Indicator Code" not in warned, "keep overrules the constant decision"

    executor = json.loads((Path(summary["run_dir"]) / "preprocess" / "executor_output.json")
                          .read_text())  # fmt: skip
    (artifact,) = executor["artifacts"]["dataset"]["artifacts"]
    schema = json.loads((Path(artifact["uri"]) / "schema.json").read_text())
    decided = {d["column"]: (d["action"], d["reason"]) for d in schema["decisions"]}
    assert decided == {
        "Country Name": ("dropped", "identifier"),
        "Country Code": ("dropped", "identifier"),
        "Indicator Name": ("dropped", "constant"),
        "published": ("date", "date"),
        "rate_reported": ("warning", "leakage"),
    }
    assert "published__month" in schema["features"]
    assert any(f.startswith("Indicator Code=") for f in schema["features"])

    report = Path(summary["report"]).read_text()
    assert '<h2 id="data">Data</h2>' in report
    assert "Country Code" in report and "rate_reported" in report and "left out" in report
