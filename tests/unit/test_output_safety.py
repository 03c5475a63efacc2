"""Nothing the suite did not create is ever deleted or replaced (issue 10, item 2).

Every case runs on real files in tmp_path and checks what a user would notice: the exit code,
the one ``ERROR [step] E_OUTPUT: ... (<path>)`` line, that every file that was there before is
byte-identical afterwards, and that allowed locations (absent, empty, the same step's earlier
output) get the output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch

from tests.helpers import TORCHRUN_VARS
from trainer import worker
from trainer.base import outputs, storage
from trainer.base.errors import InputError, error_line
from trainer.base.outputs import OUTPUT_MARKER
from trainer.base.typedconfig import from_dict
from trainer.checkpoint.manager import ROOT_STEP, CheckpointManager
from trainer.config import ModelConfig
from trainer.demo import make_table
from trainer.launch import TrainingRun
from trainer.models import ModelSpec, build_model
from trainer.models.export import save_model
from trainer.steps.evaluate import EvaluateConfig, evaluate
from trainer.steps.preprocess import PreprocessConfig, make_demo_table, preprocess
from trainer.steps.train import TrainStepConfig, train_step

REPO = Path(__file__).resolve().parents[2]
SPLITS = ("train.parquet", "val.parquet", "test.parquet", "schema.json", "stats.json")
USER_BYTES = b"my notes \x00\xff, not gpupipe's\n"


# --- helpers ----------------------------------------------------------------------------------


def snapshot(root: Path, skip: Path | None = None) -> dict[str, bytes]:
    """Every entry under ``root`` (files with their bytes), except under ``skip``."""
    found: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        if skip is not None and (path == skip or skip in path.parents):
            continue
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = b"-> " + os.readlink(path).encode()
        elif path.is_file():
            found[rel] = path.read_bytes()
        else:
            found[rel] = b"<dir>"
    return found


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("ERROR [")]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m trainer ...`` in a fresh process, with this checkout first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def mark(folder: Path, step: str, *files: str) -> Path:
    """A folder as an earlier run of ``step`` left it: its marker and some files."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in files:
        (folder / name).write_text(f"{name} from an earlier {step} run")
    storage.write_json(outputs.marker_uri(str(folder)), outputs.marker(step))
    return folder


def user_folder(folder: Path) -> Path:
    """A folder of the user's own files (no marker)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notes.txt").write_bytes(USER_BYTES)
    (folder / "sub").mkdir()
    (folder / "sub" / "thesis.tex").write_bytes(USER_BYTES * 3)
    return folder


def assert_refused(line: str, step: str, shown: Path | str, fragment: str) -> None:
    assert line.startswith(f"ERROR [{step}] E_OUTPUT: "), line
    assert line.endswith(f"({shown})"), line
    assert fragment in line, line


# --- preprocess: the table ----------------------------------------------------------------------


@dataclass
class Layout:
    """A tmp folder with the data (a file and a folder of parts) and the user's own files."""

    root: Path
    data_file: Path
    data_dir: Path
    user: Path
    empty: Path


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    table = make_demo_table(300, seed=3)
    (tmp_path / "data").mkdir()
    pq.write_table(table, tmp_path / "data" / "d.parquet")
    (tmp_path / "parts").mkdir()
    pq.write_table(table.slice(0, 150), tmp_path / "parts" / "part-0.parquet")
    pq.write_table(table.slice(150), tmp_path / "parts" / "part-1.parquet")
    (tmp_path / "empty").mkdir()
    return Layout(
        tmp_path,
        tmp_path / "data" / "d.parquet",
        tmp_path / "parts",
        user_folder(tmp_path / "user"),
        tmp_path / "empty",
    )


@dataclass
class Case:
    """Where preprocess runs and writes, and what must happen.

    ``shown`` is None for an allowed location, else the path the error line names; ``data``,
    ``output`` and ``cwd`` are callables of the layout.
    """

    data: Callable[[Layout], Path]
    output: Callable[[Layout], str]
    cwd: Callable[[Layout], Path]
    shown: Callable[[Layout], Path] | None
    fragment: str = ""


def _file(lay: Layout) -> Path:
    return lay.data_file


def _parts(lay: Layout) -> Path:
    return lay.data_dir


def _root(lay: Layout) -> Path:
    return lay.root


def _symlink(lay: Layout) -> str:
    (lay.root / "link").symlink_to(lay.empty)
    return str(lay.root / "link")


PREPROCESS_CASES = {
    "output-dot-is-cwd": Case(
        _file, lambda lay: ".", lambda lay: lay.user, lambda lay: lay.user, "working directory"
    ),
    "empty-cwd-is-still-refused": Case(
        _file, lambda lay: ".", lambda lay: lay.empty, lambda lay: lay.empty, "working directory"
    ),
    "output-contains-cwd": Case(
        _file,
        lambda lay: str(lay.root),
        lambda lay: lay.user / "sub",
        _root,
        "contains the current working directory",
    ),
    "output-is-the-input-folder": Case(
        _parts, lambda lay: str(lay.data_dir), _root, _parts, "is the data"
    ),
    "output-inside-the-input-folder": Case(
        _parts,
        lambda lay: str(lay.data_dir / "out"),
        _root,
        lambda lay: lay.data_dir / "out",
        "is inside the data",
    ),
    "output-is-the-data-file": Case(
        _file, lambda lay: str(lay.data_file), _root, _file, "is the data"
    ),
    "output-is-the-data-files-folder": Case(
        _file,
        lambda lay: str(lay.data_file.parent),
        _root,
        lambda lay: lay.data_file.parent,
        "contains the data",
    ),
    "output-is-a-file": Case(
        _file,
        lambda lay: str(lay.user / "notes.txt"),
        _root,
        lambda lay: lay.user / "notes.txt",
        "is an existing file",
    ),
    "non-empty-foreign-folder": Case(
        _file, lambda lay: str(lay.user), _root, lambda lay: lay.user, "has no gpupipe marker"
    ),
    "another-steps-output": Case(
        _file,
        lambda lay: str(mark(lay.root / "model", "train", "model.safetensors")),
        _root,
        lambda lay: lay.root / "model",
        "holds the output of the train step",
    ),
    "symlink": Case(_file, _symlink, _root, lambda lay: lay.root / "link", "is a symbolic link"),
    "absent-is-allowed": Case(_file, lambda lay: str(lay.root / "out"), _root, None),
    "relative-absent-is-allowed": Case(_file, lambda lay: "out", lambda lay: lay.empty, None),
    "empty-folder-is-allowed": Case(_file, lambda lay: str(lay.empty), _root, None),
    "own-earlier-output-is-replaced": Case(
        _parts,
        lambda lay: str(mark(lay.root / "prev", "preprocess", "stale.txt", "train.parquet")),
        _root,
        None,
    ),
}


def _check_outcome(
    lay: Layout, case: Case, output: str, before: dict[str, bytes], code: int, err: str
) -> None:
    out_path = Path(os.path.abspath(os.path.join(case.cwd(lay), output)))
    if case.shown is not None:
        assert code == 2, err
        (line,) = error_lines(err)
        assert err.strip().splitlines()[-1] == line
        assert_refused(line, "preprocess", case.shown(lay), case.fragment)
        assert snapshot(lay.root) == before  # nothing changed, nothing added
        return
    assert code == 0, err
    assert sorted(p.name for p in out_path.iterdir()) == sorted([*SPLITS, OUTPUT_MARKER])
    assert outputs.read_marker(str(out_path)) is not None
    assert outputs.read_marker(str(out_path))["step"] == "preprocess"  # type: ignore[index]
    # Everything else is as it was (the replaced earlier output is the only change).
    after = snapshot(lay.root, skip=out_path)
    assert after == {k: v for k, v in before.items() if not (lay.root / k).is_relative_to(out_path)}


@pytest.mark.parametrize("name", list(PREPROCESS_CASES))
def test_preprocess_step_output_locations(
    layout: Layout, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    case = PREPROCESS_CASES[name]
    data, output = case.data(layout), case.output(layout)
    monkeypatch.chdir(case.cwd(layout))
    before = snapshot(layout.root)
    cfg = from_dict(PreprocessConfig, {"target": "churned"})
    try:
        preprocess(cfg, data_uri=str(data), output_uri=output)
        code, err = 0, ""
    except InputError as e:
        code, err = 2, error_line("preprocess", e)
    _check_outcome(layout, case, output, before, code, err)


@pytest.mark.parametrize("name", list(PREPROCESS_CASES))
def test_preprocess_cli_output_locations(layout: Layout, name: str) -> None:
    case = PREPROCESS_CASES[name]
    data, output = case.data(layout), case.output(layout)
    before = snapshot(layout.root)
    proc = run_cli(
        "preprocess",
        "--data",
        str(data),
        "--output",
        output,
        "--set",
        "target=churned",
        cwd=case.cwd(layout),
    )
    _check_outcome(layout, case, output, before, proc.returncode, proc.stderr)
    if case.shown is not None:
        assert proc.stdout == ""


def test_home_and_filesystem_root_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = user_folder(tmp_path / "home")
    monkeypatch.setenv("HOME", str(home))
    for uri, fragment in (
        (str(home), "is the home directory"),
        (str(tmp_path), "contains the home directory"),
        ("/", "is the filesystem root"),
        ("s3://bucket", "is a whole bucket"),
        (str(tmp_path / "home" / "notes.txt" / "out"), "is a file"),
    ):
        with pytest.raises(InputError, match=fragment) as info:
            outputs.check_output_location(uri, "preprocess")
        assert info.value.code == "E_OUTPUT"
    assert (home / "notes.txt").read_bytes() == USER_BYTES


# --- atomic_dir -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["absolute", "relative", "file"])
def test_atomic_dir_publishes_with_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "model"
    target = {"absolute": str(path), "relative": "model", "file": f"file://{path}"}[kind]
    with outputs.atomic_dir(target, step="train") as tmp:
        assert ".tmp-" in tmp and storage.is_dir(tmp)
        storage.write_json(storage.join(tmp, "model.json"), {"ok": True})
        assert not path.exists()
    assert storage.read_json(storage.join(target, "model.json")) == {"ok": True}
    assert os.listdir(tmp_path) == ["model"]
    assert sorted(os.listdir(path)) == [OUTPUT_MARKER, "model.json"]
    marker = json.loads((path / OUTPUT_MARKER).read_text())
    assert marker["created_by"] == "gpupipe" and marker["step"] == "train"
    assert {"version", "created"} <= set(marker)


def test_atomic_dir_failure_leaves_nothing(tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError, match="training blew up"),
        outputs.atomic_dir(str(tmp_path / "model"), step="train") as tmp,
    ):
        storage.write_bytes(storage.join(tmp, "half.bin"), b"x")
        raise RuntimeError("training blew up")
    assert os.listdir(tmp_path) == []


def test_atomic_dir_replaces_own_earlier_output_whole(tmp_path: Path) -> None:
    mark(tmp_path / "model", "train", "stale.txt", "model.json")
    with outputs.atomic_dir(str(tmp_path / "model"), step="train") as tmp:
        storage.write_text(storage.join(tmp, "new.txt"), "new")
        # Readers still see the complete earlier output while the new one is written.
        assert (tmp_path / "model" / "stale.txt").exists()
    assert sorted(os.listdir(tmp_path / "model")) == [OUTPUT_MARKER, "new.txt"]
    assert os.listdir(tmp_path) == ["model"]


def test_atomic_dir_failure_keeps_own_earlier_output(tmp_path: Path) -> None:
    mark(tmp_path / "model", "train", "model.json")
    before = snapshot(tmp_path)
    with (
        pytest.raises(KeyboardInterrupt),
        outputs.atomic_dir(str(tmp_path / "model"), step="train") as tmp,
    ):
        storage.write_text(storage.join(tmp, "new.txt"), "new")
        raise KeyboardInterrupt
    assert snapshot(tmp_path) == before


def test_atomic_dir_refuses_files_that_appear_while_the_step_works(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with (
        pytest.raises(InputError, match="has no gpupipe marker"),
        outputs.atomic_dir(str(target), step="preprocess") as tmp,
    ):
        storage.write_text(storage.join(tmp, "schema.json"), "{}")
        user_folder(target)  # someone else puts files there meanwhile
    assert (target / "notes.txt").read_bytes() == USER_BYTES
    assert sorted(os.listdir(tmp_path)) == ["out"]  # and our temporary folder is gone


# --- train: model and work folders -----------------------------------------------------------


class SavingLauncher:
    """Stands in for the training job: rank 0's export of a tiny model to the model URI."""

    def __init__(self) -> None:
        self.launched = 0

    def launch(self, run: TrainingRun) -> None:
        self.launched += 1
        cfg = storage.read_json(run.config_uri)
        spec = ModelSpec(task="classification", in_features=2, num_classes=2)
        model_cfg = ModelConfig(name="mlp", num_layers=0)
        save_model(
            cfg["output"]["model_uri"],
            build_model(model_cfg, spec),
            model_cfg=model_cfg,
            spec=spec,
            features=["a", "b"],
            target="y",
            schema=None,
            metrics={"val_loss": 0.5},
            extra={"train": {"steps": 3}},
        )


def dataset(root: Path) -> Path:
    """A folder that looks like a preprocess output to the train step."""
    folder = mark(root, "preprocess", "train.parquet")
    schema = {"target": "y", "task": "classification", "features": ["a", "b"]}
    storage.write_json(str(folder / "schema.json"), schema)
    return folder


TRAIN_REFUSED = {
    # name: (model, work, shown, fragment), as paths relative to tmp_path ("" = default work)
    "model-is-the-dataset": ("ds", "", "ds", "is the dataset"),
    "model-inside-the-dataset": ("ds/model", "", "ds/model", "is inside the dataset"),
    "model-is-cwd": (".", "w", ".", "working directory"),
    "model-is-a-user-folder": ("user", "", "user", "has no gpupipe marker"),
    "model-is-a-preprocess-output": ("ds2", "", "ds2", "holds the output of the preprocess step"),
    "model-is-a-file": ("user/notes.txt", "w", "user/notes.txt", "is an existing file"),
    "work-is-a-user-folder": ("model", "user", "user", "has no gpupipe marker"),
    "work-is-the-model": ("model", "model", "model", "is the work folder"),
    "work-is-a-train-model": ("model", "old-model", "old-model", "holds the output of the train"),
}


@pytest.mark.parametrize("name", list(TRAIN_REFUSED))
def test_train_step_refuses_before_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    model, work, shown, fragment = TRAIN_REFUSED[name]
    monkeypatch.chdir(tmp_path)
    ds = dataset(tmp_path / "ds")
    dataset(tmp_path / "ds2")
    user_folder(tmp_path / "user")
    mark(tmp_path / "old-model", "train", "model.safetensors")
    before = snapshot(tmp_path)
    launcher = SavingLauncher()

    with pytest.raises(InputError) as info:
        train_step(
            TrainStepConfig(),
            dataset_uri=str(ds),
            model_uri=str(tmp_path / model) if model != "." else ".",
            work_uri=str(tmp_path / (work or model + "-work")),
            job_name="t",
            launcher=launcher,
        )

    assert_refused(error_line("train", info.value), "train", tmp_path / shown, fragment)
    assert launcher.launched == 0
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("model", ["absent", "empty", "own-earlier-model"])
def test_train_step_writes_new_empty_or_own_model_folders(tmp_path: Path, model: str) -> None:
    ds = dataset(tmp_path / "ds")
    user = user_folder(tmp_path / "user")
    target = tmp_path / "model"
    if model == "empty":
        target.mkdir()
    elif model == "own-earlier-model":
        mark(target, "train", "stale.txt", "model.safetensors")
        mark(tmp_path / "model-work", "train-work", "worker-config.json")
    before = snapshot(user)
    launcher = SavingLauncher()

    result = train_step(
        TrainStepConfig(),
        dataset_uri=str(ds),
        model_uri=str(target),
        work_uri=str(tmp_path / "model-work"),
        job_name="t",
        launcher=launcher,
    )

    assert launcher.launched == 1 and result.steps == 3
    assert sorted(os.listdir(target)) == [
        OUTPUT_MARKER,
        "cost.json",  # the estimate before launch and the actual
        "metrics.json",
        "model.json",
        "model.safetensors",
    ]
    assert outputs.read_marker(str(tmp_path / "model-work"))["step"] == "train-work"  # type: ignore[index]
    assert snapshot(user) == before


@pytest.mark.parametrize(
    ("args", "shown", "fragment"),
    [
        (["--model", "ds"], "ds", "is the dataset"),
        (["--model", "."], ".", "working directory"),
        (["--model", "m", "--work", "user"], "user", "has no gpupipe marker"),
    ],
    ids=["model-is-the-dataset", "model-is-cwd", "work-is-a-user-folder"],
)
def test_train_cli_refuses_before_the_job(
    tmp_path: Path, args: list[str], shown: str, fragment: str
) -> None:
    dataset(tmp_path / "ds")
    user_folder(tmp_path / "user")
    before = snapshot(tmp_path)

    proc = run_cli("train", "--dataset", "ds", *args, cwd=tmp_path)

    assert proc.returncode == 2, proc.stderr
    (line,) = error_lines(proc.stderr)
    assert_refused(line, "train", tmp_path / shown if shown != "." else tmp_path, fragment)
    assert snapshot(tmp_path) == before


# --- evaluate: the report file ----------------------------------------------------------------


@pytest.fixture
def scored(tmp_path: Path) -> tuple[str, str]:
    """A model and a dataset the evaluate step can score."""
    table = make_table(200, features=2, classes=2, seed=1)
    ds = tmp_path / "ds"
    ds.mkdir()
    pq.write_table(table, ds / "test.parquet")
    spec = ModelSpec(task="classification", in_features=2, num_classes=2)
    model_cfg = ModelConfig(name="mlp", num_layers=0)
    torch.manual_seed(0)
    save_model(
        str(tmp_path / "model"),
        build_model(model_cfg, spec),
        model_cfg=model_cfg,
        spec=spec,
        features=[c for c in table.column_names if c != "label"],
        target="label",
        schema=None,
        metrics={"val_loss": 0.5},
    )
    return str(tmp_path / "model"), str(ds)


@pytest.mark.parametrize(
    ("report", "fragment"),
    [
        ("user/notes.txt", "exists and was not written by gpupipe"),
        ("user", "is an existing folder"),
        ("model/report.html", "is inside the model"),
        ("ds/test.parquet", "is inside the dataset"),
        ("other.json", "holds the output of the tune step"),
    ],
    ids=["user-file", "folder", "inside-the-model", "the-data", "another-steps-file"],
)
def test_evaluate_refuses_report_locations(
    tmp_path: Path, scored: tuple[str, str], report: str, fragment: str
) -> None:
    user_folder(tmp_path / "user")
    storage.write_text(str(tmp_path / "other.json"), "{}")
    storage.write_json(
        outputs.marker_uri(str(tmp_path / "other.json"), "file"), outputs.marker("tune")
    )
    before = snapshot(tmp_path)
    model, ds = scored

    with pytest.raises(InputError) as info:
        evaluate(
            EvaluateConfig(), model_uri=model, dataset_uri=ds, report_uri=str(tmp_path / report)
        )

    assert_refused(error_line("evaluate", info.value), "evaluate", tmp_path / report, fragment)
    assert snapshot(tmp_path) == before


def test_evaluate_replaces_its_own_earlier_report(tmp_path: Path, scored: tuple[str, str]) -> None:
    model, ds = scored
    report = tmp_path / "out" / "report.html"
    evaluate(EvaluateConfig(), model_uri=model, dataset_uri=ds, report_uri=str(report))
    assert sorted(os.listdir(report.parent)) == [f".report.html{OUTPUT_MARKER}", "report.html"]
    report.write_text("an earlier attempt")

    evaluate(EvaluateConfig(), model_uri=model, dataset_uri=ds, report_uri=str(report))

    assert report.read_text().lower().startswith("<!doctype html>")


def test_evaluate_cli_refuses_a_user_file_as_report(
    tmp_path: Path, scored: tuple[str, str]
) -> None:
    user_folder(tmp_path / "user")
    before = snapshot(tmp_path)
    model, ds = scored

    proc = run_cli(
        "evaluate", "--model", model, "--dataset", ds, "--report", "user/notes.txt", cwd=tmp_path
    )

    assert proc.returncode == 2, proc.stderr
    (line,) = error_lines(proc.stderr)
    assert_refused(line, "evaluate", tmp_path / "user" / "notes.txt", "not written by gpupipe")
    assert snapshot(tmp_path) == before


# --- tune: files and the work folder ----------------------------------------------------------


def test_tune_refuses_a_user_file_and_a_user_work_folder(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    from tests.helpers import tune_config, write_dataset
    from trainer.steps.tune import tune

    data = str(write_dataset(tmp_path / "data"))
    user_folder(tmp_path / "user")
    before = snapshot(tmp_path)
    for kwargs, shown, fragment in (
        ({"output_uri": "user/notes.txt"}, "user/notes.txt", "not written by gpupipe"),
        ({"work_uri": "user"}, "user", "has no gpupipe marker"),
        ({"work_uri": "data"}, "data", "is the dataset"),
    ):
        uris = {
            "work_uri": "work",
            "output_uri": "best.json",
            "report_uri": "report.html",
            **kwargs,
        }
        with pytest.raises(InputError) as info:
            tune(tune_config(), dataset_uri=data, **{k: str(tmp_path / v) for k, v in uris.items()})
        assert info.value.code == "E_OUTPUT" and info.value.where == str(tmp_path / shown)
        assert fragment in str(info.value)
        assert snapshot(tmp_path) == before


# --- checkpoints ----------------------------------------------------------------------------------


def _state(value: float) -> dict[str, Any]:
    return {"w": torch.full((2,), value)}


@pytest.mark.parametrize(
    ("prepare", "fragment"),
    [
        (user_folder, "has no gpupipe marker"),
        (lambda p: mark(p, "train", "model.safetensors"), "holds the output of the train step"),
    ],
    ids=["user-files", "a-model-folder"],
)
def test_checkpoint_root_that_is_not_the_managers_is_refused(
    tmp_path: Path, prepare: Callable[[Path], Path], fragment: str
) -> None:
    root = prepare(tmp_path / "ckpt")
    before = snapshot(tmp_path)

    with pytest.raises(InputError, match=fragment) as info:
        CheckpointManager(str(root))

    assert info.value.code == "E_OUTPUT" and info.value.where == str(root)
    assert snapshot(tmp_path) == before


def test_checkpoint_manager_never_touches_files_it_did_not_create(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    manager = CheckpointManager(str(root), keep_last=1)
    manager.save(1, _state(1.0))
    assert outputs.read_marker(str(root))["step"] == ROOT_STEP  # type: ignore[index]
    # Later, someone puts their own things next to the checkpoints, some with similar names.
    foreign = ["notes.txt", "step-1", "step-00000001.bak", "step-00000002.corrupt", "step-x.tmp"]
    for name in foreign:
        (root / name).write_bytes(USER_BYTES)
    (root / "mine").mkdir()
    (root / "mine" / "step-00000003").write_bytes(USER_BYTES)
    before = {k: v for k, v in snapshot(root).items() if k.split("/")[0] in [*foreign, "mine"]}
    assert len(before) == len(foreign) + 2

    for step in (2, 3, 4):  # saves that prune (keep_last=1)
        manager.save(step, _state(float(step)))
    manager.save(3, _state(30.0))  # a rollback: drops step 4
    (root / "step-00000003" / "state.pt").write_bytes(b"garbage")  # quarantined on load
    (root / "step-00000005.tmp").mkdir()  # an interrupted save's leftover: removed on load
    assert manager.load_latest() is None

    after = snapshot(root)
    for name, content in before.items():
        assert after[name] == content, name
    assert "step-00000005.tmp" not in after and "step-00000003.corrupt-0" in after


def test_worker_with_a_foreign_checkpoint_folder_exits_2_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    table = make_table(128, features=2, classes=2, seed=2)
    pq.write_table(table, tmp_path / "train.parquet")
    ckpt = user_folder(tmp_path / "ckpt")
    cfg = {
        "data": {"train_uri": str(tmp_path / "train.parquet")},
        "model": {"hidden_dim": 4, "num_layers": 1},
        "train": {"epochs": 1, "global_batch_size": 32},
        "checkpoint": {"uri": str(ckpt)},
        "output": {"model_uri": str(tmp_path / "model")},
    }
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    before = snapshot(tmp_path)

    assert worker.main(["--config", str(tmp_path / "cfg.json")]) == 2

    (line,) = error_lines(capsys.readouterr().err)
    assert_refused(line, "train", ckpt, "has no gpupipe marker")
    assert snapshot(tmp_path) == before
