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
        "ERROR [gpupipe demo-data] E_CONFIG: rows must be >= 1 (a table with no rows trains "
        "nothing), got -1 (rows)"
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
    from pipelines.cli.run import print_summary

    metrics = {
        "accuracy": 0.8167,
        "baseline_trivial_accuracy": 0.6273,
        "baseline_linear_accuracy": 0.818,
        "baseline_linear_roc_auc": 0.88,
    }
    print_summary({"run_dir": "r", "state": "SUCCEEDED", "metrics": metrics, "gate_passed": True})
    lines = capsys.readouterr().out.splitlines()
    assert "  accuracy       0.8167" in lines
    assert lines.index("  vs trivial     accuracy 0.6273") < lines.index(
        "  vs linear      accuracy 0.8180, roc_auc 0.8800"
    )
    assert not any("baseline_" in line for line in lines)


def test_local_summary_lists_evaluate_s_baselines_artifact_with_the_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Evaluate writes the model's metrics and the baselines' in two artifacts (issue 62, item
    3); the summary lists both, as before."""
    from pipelines.cli.run import print_summary
    from pipelines.local_report import summarize

    def artifact(metadata: dict[str, float]) -> dict:
        return {"artifacts": [{"metadata": metadata}]}

    (tmp_path / "evaluate").mkdir()
    (tmp_path / "evaluate" / "executor_output.json").write_text(
        json.dumps(
            {
                "parameterValues": {"Output": True},
                "artifacts": {
                    "metrics": artifact({"accuracy": 0.81, "gate_passed": 1.0}),
                    "baselines": artifact({"trivial_accuracy": 0.62, "linear_accuracy": 0.8}),
                },
            }
        )
    )
    s = summarize(tmp_path)
    assert s["metrics"] == {
        "accuracy": 0.81,
        "baseline_trivial_accuracy": 0.62,
        "baseline_linear_accuracy": 0.8,
    }
    print_summary({**s, "state": "SUCCEEDED"})
    lines = capsys.readouterr().out.splitlines()
    assert "  accuracy       0.8100" in lines and "  vs trivial     accuracy 0.6200" in lines


# --- issue 22: refusals and help a new user meets ------------------------------------------


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--wait"], "--wait"),
        (["--timeout", "60"], "--timeout"),
        (["--namespace", "team-a"], "--namespace"),
        (["--token", "abc"], "--token"),
        (["--token-file", "-"], "--token-file"),
        (["--ca-cert", "ca.pem"], "--ca-cert"),
        (["--experiment", "nightly"], "--experiment"),
        (["--run-name", "x"], "--run-name"),
        (["--pipeline", "p"], "--pipeline"),
        (["--version", "v1"], "--version"),
        (["--compiled"], "--compiled"),
        (["--wait", "--namespace", "team-a"], "--namespace, --wait"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_cluster_only_flags_with_local_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], named: str
) -> None:
    root = tmp_path / "root"
    assert main(["run", "--local", "--root", str(root), *extra]) == 2
    err = capsys.readouterr().err
    assert _error_lines(err) == [err.strip()], err
    assert err.startswith(
        f"ERROR [gpupipe run] E_PARAM: {named} only apply to cluster runs (--host)"
    ) or err.startswith(f"ERROR [gpupipe run] E_PARAM: {named} only applies to cluster runs")
    assert "abc" not in err  # a token is never echoed
    assert not root.exists()


@pytest.mark.parametrize(
    "extra",
    [
        ["--root", "r"],
        ["--json"],
        ["--registry-timeout", "9"],
        ["--runner", "docker"],
        ["--verbose"],
    ],
    ids=lambda v: v[0],
)
def test_local_only_flags_with_host_are_refused(
    capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    # Refused before any request: the host does not exist.
    assert main(["run", "--host", "http://127.0.0.1:9", "--data", "s3://b/d.csv", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ERROR [gpupipe run] E_PARAM: {extra[0]} only applies to local runs")


@pytest.mark.parametrize(
    ("param", "suggestion"),
    [
        ("epochz=3", "did you mean 'epochs'?"),
        ("learnig_rate=0.1", "did you mean 'learning_rate'?"),
        ("tune.enabeld=true", "did you mean 'tune_enabled'"),
        ('hyperparams_json={"optim.weight_decy": 0.1}', "did you mean optim.weight_decay?"),
        ('hyperparams_json={"optm.lr": 0.1}', "did you mean optim?"),
        ('train_config_json={"timout_s": 5}', "did you mean timeout_s?"),
    ],
    ids=["param", "param-2", "dotted-param", "json-key", "json-section", "train-config-key"],
)
def test_misspelt_names_get_a_did_you_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], param: str, suggestion: str
) -> None:
    assert main(["run", "--local", "--root", str(tmp_path / "r"), "--param", param]) == 2
    err = capsys.readouterr().err
    assert _error_lines(err) == [err.strip()], err
    assert suggestion in err, err


def test_a_name_near_nothing_lists_every_parameter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--local", "--root", str(tmp_path / "r"), "--param", "qqq=1"]) == 2
    err = capsys.readouterr().err
    assert "did you mean" not in err and "known: batch_size, column_roles_json" in err


def test_run_help_lists_the_pipeline_parameters_with_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pipelines.params import pipeline_parameters

    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for name, default in pipeline_parameters().items():
        shown = "required" if default is None else f"default {json.dumps(default)}"
        assert f"  {name} (" in out and shown in out.split(f"  {name} (", 1)[1].split("\n")[0]
    assert "epochs (integer, default 0)" in out
    assert "passes over the training split" in out


def test_compile_out_writes_only_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--out X`` writes the pipeline YAML into X and nothing under the current directory."""
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "components" / "train" / "component.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text("my own component\n")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    out = tmp_path / "elsewhere"
    assert main(["compile", "--out", str(out)]) == 0
    assert mine.read_text() == "my own component\n"
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if out not in p.parents)
    assert after == [*before, Path("elsewhere")]
    assert {p.name for p in out.iterdir()} == {
        f"{PIPELINE_NAME}.yaml",
        f".{PIPELINE_NAME}.yaml.gpupipe-output.json",
    }
    assert main(["compile", "--out", str(out)]) == 0, "its own output is replaced"
    capsys.readouterr()


@pytest.mark.parametrize("flag", ["--out", "--components-dir"])
def test_compile_refuses_to_overwrite_a_file_it_did_not_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    folder = tmp_path / "dest"
    name = f"{PIPELINE_NAME}.yaml" if flag == "--out" else "train/component.yaml"
    mine = folder / name
    mine.parent.mkdir(parents=True)
    mine.write_text("a file of my own\n")
    assert main(["compile", flag, str(folder)]) == 2
    err = capsys.readouterr().err
    assert _error_lines(err) == [err.strip()]
    assert err.startswith("ERROR [gpupipe compile] E_OUTPUT: ") and str(mine) in err
    assert "was not written by gpupipe" in err
    assert mine.read_text() == "a file of my own\n"
    assert sorted(p.name for p in folder.rglob("*")) == sorted(Path(name).parts)


@pytest.mark.parametrize("name", ["table.parquet", "notes.csv"])
def test_demo_data_refuses_to_overwrite_a_users_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    mine = tmp_path / name
    mine.write_bytes(b"my own data\n")
    assert main(["demo-data", "--out", str(mine), "--rows", "50"]) == 2
    err = capsys.readouterr().err
    assert _error_lines(err) == [err.strip()]
    assert err.startswith("ERROR [gpupipe demo-data] E_OUTPUT: ") and str(mine) in err
    assert mine.read_bytes() == b"my own data\n"
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_demo_data_replaces_its_own_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d.parquet"
    assert main(["demo-data", "--out", str(out), "--rows", "50"]) == 0
    assert main(["demo-data", "--out", str(out), "--rows", "80"]) == 0
    assert pq.read_table(out).num_rows == 80
    capsys.readouterr()


def test_demo_data_with_zero_rows_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d.parquet"
    assert main(["demo-data", "--out", str(out), "--rows", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ERROR [gpupipe demo-data] E_CONFIG: rows must be >= 1")
    assert not tmp_path.joinpath("d.parquet").exists() and not list(tmp_path.iterdir())


# --- issue 41: --version, and help that reads as plain text -----------------------------------
def test_version_prints_the_version_and_the_images_pipelines_are_compiled_with(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from components.images import CPU_IMAGE, CUDA_IMAGE
    from trainer.base.version import __version__

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"gpupipe {__version__}"
    images = {line.split()[0]: line.split(None, 1)[1] for line in lines[2:]}
    assert set(images) == {CPU_IMAGE, CUDA_IMAGE}
    assert "train" in images[CUDA_IMAGE] and "preprocess" in images[CPU_IMAGE]


@pytest.mark.parametrize(
    "command", ["", "demo-data", "compile", "render", "run", "upload", "schedule"], ids=str
)
def test_help_reads_as_plain_text(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*command.split(), "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: gpupipe")
    assert "`" not in out and ":func:" not in out and ":mod:" not in out


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        ("The ``gpupipe`` command", "The gpupipe command"),
        ("from `gpupipe compile`", "from gpupipe compile"),
        (
            ":func:`typed_parameters` and :py:mod:`~trainer.steps`",
            "typed_parameters and trainer.steps",
        ),
        ("no markup: a 'quote' and *stars*", "no markup: a 'quote' and *stars*"),
    ],
    ids=["double", "single", "roles", "untouched"],
)
def test_plain_text_strips_docstring_markup(text: str, plain: str) -> None:
    from pipelines.cli.help import plain_text

    assert plain_text(text) == plain
