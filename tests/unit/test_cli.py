"""The ``gpupipe`` and ``python -m trainer`` commands as a person at a shell meets them."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import yaml

import trainer.__main__ as trainer_main
from pipelines.cli import main
from pipelines.training import PIPELINE_NAME

REPO = Path(__file__).resolve().parents[2]


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("ERROR [")]


@pytest.mark.parametrize(
    ("file_name", "extra", "read", "target"),
    [
        ("d.parquet", [], pq.read_table, "churned"),
        ("d.csv", [], pacsv.read_csv, "churned"),
        ("r.parquet", ["--task", "regression"], pq.read_table, "spend"),
    ],
    ids=["parquet", "csv", "regression"],
)
def test_demo_data_writes_a_readable_table(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    file_name: str,
    extra: list[str],
    read: Callable[[str], pa.Table],
    target: str,
) -> None:
    out = tmp_path / file_name
    assert main(["demo-data", "--out", str(out), "--rows", "500", *extra]) == 0
    table = read(str(out))
    assert table.num_rows == 500
    assert target in table.column_names
    assert table.column(target).null_count == 0
    assert "wrote 500 rows" in capsys.readouterr().out


def test_demo_data_bad_rows_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d.parquet"
    assert main(["demo-data", "--out", str(out), "--rows", "-1"]) == 2
    err = capsys.readouterr().err
    assert _error_lines(err) == [
        "ERROR [gpupipe demo-data] E_CONFIG: rows must be >= 0, got -1 (rows)"
    ]
    assert not out.exists()


def test_compile_writes_pipeline_and_components(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, comps = tmp_path / "compiled", tmp_path / "components"
    assert main(["compile", "--out", str(out), "--components-dir", str(comps)]) == 0
    pipeline_yaml = out / f"{PIPELINE_NAME}.yaml"
    spec, platform = yaml.safe_load_all(pipeline_yaml.read_text())
    assert spec["pipelineInfo"]["name"] == PIPELINE_NAME
    assert "kubernetes" in platform["platforms"]
    written = capsys.readouterr().out
    assert f"wrote {pipeline_yaml}" in written
    for name in ("preprocess", "train", "evaluate", "register", "notify"):
        assert (comps / name / "component.yaml").is_file()
        assert f"wrote {comps / name / 'component.yaml'}" in written


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["run", "--local", "--param", "nosuch=1"],
            "ERROR [gpupipe run] E_PARAM: unknown pipeline parameter 'nosuch'",
        ),
        (
            ["run", "--local", "--param", "epochs"],
            "ERROR [gpupipe run] E_PARAM: parameter must look like name=value, got 'epochs'",
        ),
        (["run", "--param", "epochs=1"], "ERROR [gpupipe run] E_PARAM: only local runs"),
    ],
    ids=["unknown-param", "param-without-value", "no-local"],
)
def test_run_rejects_bad_arguments_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    root = tmp_path / "root"
    assert main([*argv, "--root", str(root)]) == 2
    captured = capsys.readouterr()
    lines = _error_lines(captured.err)
    assert len(lines) == 1 and lines[0].startswith(message), captured.err
    assert not root.exists(), "a rejected run must not leave a run folder behind"


@pytest.fixture(scope="module")
def demo_parquet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "churn.parquet"
    assert main(["demo-data", "--out", str(out), "--rows", "500"]) == 0
    return out


def test_trainer_preprocess_prints_json_and_writes_dataset(
    demo_parquet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "dataset"
    argv = ["preprocess", "--data", str(demo_parquet), "--output", str(out)]
    assert trainer_main.main([*argv, "--set", "target=churned"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["task"] == "classification"
    assert result["train_rows"] + result["val_rows"] + result["test_rows"] == 500
    for split in ("train", "val", "test"):
        assert pq.read_table(out / f"{split}.parquet").num_rows == result[f"{split}_rows"]
    assert json.loads((out / "schema.json").read_text())


def test_trainer_unknown_config_key_exits_2_with_one_line(
    demo_parquet: Path, tmp_path: Path
) -> None:
    out = tmp_path / "dataset"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "preprocess", "--data", str(demo_parquet),
         "--output", str(out), "--set", "target=churned", "--set", "nosuch=1"],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = _error_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ERROR [preprocess] E_CONFIG: unknown config key nosuch")
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert not out.exists(), "bad input must leave no partial output"


@pytest.mark.parametrize("flag", ["--out", "--components-dir"])
def test_compile_onto_a_file_is_one_line_and_leaves_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    target = tmp_path / "a-file.yaml"
    target.write_text("mine\n")
    argv = ["compile", "--out", str(tmp_path / "out"), "--components-dir", str(tmp_path / "c")]
    argv[argv.index(flag) + 1] = str(target)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert _error_lines(err) == [err.strip()]
    assert err.startswith(f"ERROR [gpupipe compile] E_PATH: {flag} must be a folder")
    assert str(target) in err
    assert target.read_text() == "mine\n"


def test_summary_shows_each_baseline_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines.cli import _print_summary

    metrics = {
        "accuracy": 0.8167,
        "baseline_trivial_accuracy": 0.6273,
        "baseline_linear_accuracy": 0.818,
        "baseline_linear_roc_auc": 0.88,
    }
    _print_summary({"run_dir": "r", "state": "SUCCEEDED", "metrics": metrics, "gate_passed": True})
    lines = capsys.readouterr().out.splitlines()
    assert "  accuracy       0.8167" in lines
    assert lines.index("  vs trivial     accuracy 0.6273") < lines.index(
        "  vs linear      accuracy 0.8180, roc_auc 0.8800"
    )
    assert not any("baseline_" in line for line in lines)
