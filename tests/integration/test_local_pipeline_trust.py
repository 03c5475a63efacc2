"""Promises of ``gpupipe run --local`` that a new user's real tables broke (issue 22, items 1-4).

Changed data is read again; numbers written with decimal commas are named and read with
``csv_decimal``; a target or a test split that cannot mean anything is refused or never gated;
and what preprocess will decide (the task, and why) is said before any step runs.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.integration.test_local_pipeline import EPOCHS, Run, gpupipe
from trainer.steps.preprocess import make_demo_table

pytestmark = pytest.mark.integration


def run(root: Path, data: Path, target: str, *params: str) -> Run:
    argv = ["run", "--local", "--json", "--root", str(root), "--data", str(data)]
    argv += ["--target", target, "--param", f"epochs={EPOCHS}"]
    for p in params:
        argv += ["--param", p]
    return gpupipe(*argv, cwd=root.parent)


def closed_port_registry() -> str:
    """A registry URI nobody answers: the run stops at the registry check, after the data's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"registry_uri=http://127.0.0.1:{port}"


def lines(stderr: str, prefix: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(prefix)]


def schema_of(summary: dict) -> dict:
    run_dir = Path(summary["run_dir"])
    executor = json.loads((run_dir / "preprocess" / "executor_output.json").read_text())
    (artifact,) = executor["artifacts"]["dataset"]["artifacts"]
    return json.loads((Path(artifact["uri"]) / "schema.json").read_text())


def wine_csv(path: Path, rows: int, *, quality_step: float = 0.1) -> None:
    """A ';'-separated table with decimal commas, as European spreadsheets write it."""
    rng = np.random.default_rng(0)
    alcohol = rng.normal(10.5, 1.0, rows)
    ph = rng.normal(3.3, 0.15, rows)
    quality = np.round((alcohol * 0.6 - ph + rng.normal(0, 0.3, rows)) / quality_step)
    body = [
        f"{a:.1f};{p:.2f};{q * quality_step:.1f}".replace(".", ",")
        for a, p, q in zip(alcohol, ph, quality, strict=True)
    ]
    path.write_text("alcohol;ph;quality\n" + "\n".join(body) + "\n")


# --- item 1: changed data ------------------------------------------------------------------


# Two whole pipeline runs (~60 s): make test-slow (.ci/run runs it after make test).
@pytest.mark.slow
def test_replaced_data_is_read_again_not_served_from_cache(tmp_path: Path) -> None:
    data = tmp_path / "data.parquet"
    table = make_demo_table(3000, seed=1)
    pq.write_table(table, data)
    root = tmp_path / "root"
    first = run(root, data, "churned")
    assert first.returncode == 0, first.stderr[-3000:]

    # The same path, a 1,000-row sample of the same table.
    pq.write_table(table.take(np.arange(0, 3000, 3)), data)
    second = run(root, data, "churned")
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.executed("preprocess"), "preprocess was served from cache on changed data"
    rows = [sum(schema_of(r.summary)["splits"].values()) for r in (first, second)]
    assert rows == [3000, 1000]
    before, after = (schema_of(r.summary)["data_fingerprint"] for r in (first, second))
    assert before != after and before.startswith("fp1:")

    # Unchanged data: the cache serves preprocess again.
    third = run(root, data, "churned")
    assert third.returncode == 0, third.stderr[-3000:]
    assert not third.executed("preprocess")


# --- items 2 and 3: decimal commas, the target, the test split ----------------------------


def test_numbers_with_decimal_commas_in_the_target_are_refused_with_the_cause(
    tmp_path: Path,
) -> None:
    data = tmp_path / "wine.csv"
    wine_csv(data, 400)
    root = tmp_path / "root"
    refused = run(root, data, "quality", "csv_delimiter=;")
    assert refused.returncode == 2
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("ERROR [gpupipe run] E_TARGET: target 'quality' holds numbers "), last
    assert "decimal ','" in last and "--param csv_decimal=," in last, last
    assert "fraction" not in last  # no advice that leads to a 1-row test split
    assert refused.summary["state"] == "REJECTED"
    assert not root.exists(), "a refused run must write nothing"


# Whole pipeline runs (20-45 s each): make test-slow (.ci/run runs it after make test).
@pytest.mark.slow
def test_decimal_commas_are_named_before_any_step_and_read_with_csv_decimal(
    tmp_path: Path,
) -> None:
    data = tmp_path / "wine.csv"
    wine_csv(data, 400)
    # Target fine, features written with decimal commas: a warning that names the column.
    warned = run(
        tmp_path / "r1", data, "quality", "csv_delimiter=;", "task=classification",
        closed_port_registry(),
    )  # fmt: skip
    assert warned.returncode == 2  # stopped at the registry check, after the data's
    (alcohol,) = [
        w for w in lines(warned.stderr, "WARNING [gpupipe run] W_DECIMAL") if "alcohol" in w
    ]
    assert "'alcohol' holds numbers written with decimal ','" in alcohol
    assert "--param csv_decimal=," in alcohol

    # With csv_decimal=, (';' then separates fields by default) every column is a number.
    ok = run(tmp_path / "r2", data, "quality", "csv_decimal=,")
    assert ok.returncode == 0, ok.stderr[-3000:]
    schema = schema_of(ok.summary)
    kinds = {c["name"]: c["kind"] for c in schema["columns"]}
    assert kinds == {"alcohol": "numeric", "ph": "numeric"}, kinds
    assert schema["task"] == "regression"
    assert not lines(ok.stderr, "WARNING [gpupipe run] W_DECIMAL")


# Whole pipeline runs (20-45 s each): make test-slow (.ci/run runs it after make test).
@pytest.mark.slow
def test_a_test_split_too_small_is_never_gated_or_registered(tmp_path: Path) -> None:
    data = tmp_path / "small.parquet"
    pq.write_table(make_demo_table(120, seed=2), data)
    result = run(tmp_path / "root", data, "churned")
    assert result.returncode == 0, result.stderr[-3000:]
    (warning,) = lines(result.stderr, "WARNING [gpupipe run] W_TEST_SPLIT")
    assert "18 rows" in warning and "30" in warning, warning
    s = result.summary
    assert s["state"] == "SUCCEEDED"
    assert s["gate_passed"] is False
    assert s["gate_reason"].startswith("not gated: the test split has 18 rows, fewer than the 30")
    assert s.get("registered_version") is None
    assert not (Path(s["run_dir"]) / "register").exists()


# --- item 4: the task, and dates, decided before any step ---------------------------------


def test_the_task_is_said_before_any_step_with_a_warning_for_few_fractional_values(
    tmp_path: Path,
) -> None:
    table = make_demo_table(400, seed=3)
    churned = table.column("churned").to_pylist()
    labels = [1.5 if v == churned[0] else 0.5 for v in churned]
    data = tmp_path / "half.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("churned"), "churned",
                                    pa.array(labels)), data)  # fmt: skip
    result = run(tmp_path / "root", data, "churned", closed_port_registry())
    assert result.returncode == 2
    (warning,) = lines(result.stderr, "WARNING [gpupipe run] W_TASK")
    assert "task regression: target 'churned' has only 2 distinct values (0.5, 1.5)" in warning
    assert "--param task=classification" in warning
    assert result.stderr.strip().splitlines()[-1].startswith("ERROR [gpupipe run] E_REGISTRY")


@pytest.mark.parametrize(
    ("values", "shown"),
    [
        (pa.array(np.arange(200).astype("datetime64[D]").astype("datetime64[ms]")), "timestamp"),
        (pa.array([f"{1 + i % 28:02d}.{1 + i % 12:02d}.2024" for i in range(200)]), "'01.01.2024'"),
    ],
    ids=["parquet-timestamp", "text-dates"],
)
def test_date_columns_are_said_to_become_numbers_before_any_step_whatever_their_form(
    tmp_path: Path, values: pa.Array, shown: str
) -> None:
    data = tmp_path / "dated.parquet"
    pq.write_table(make_demo_table(200, seed=4).append_column("signup", values), data)
    root = tmp_path / "root"
    result = run(root, data, "churned", closed_port_registry())
    (note,) = lines(result.stderr, "NOTE [gpupipe run] I_DATE")
    assert note.startswith("NOTE [gpupipe run] I_DATE: column 'signup' holds dates ("), note
    assert shown in note
    assert "signup__year" in note and "signup__elapsed_days" in note
    # the run went on to the registry check (which nobody answers here)
    assert result.stderr.strip().splitlines()[-1].startswith("ERROR [gpupipe run] E_REGISTRY")
