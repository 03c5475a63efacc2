"""preprocess and fingerprint take the table as a Dataset artifact from an upstream step or as
``data_uri`` (issue 62, item 1): an artifact as a user's own component writes it (Parquet or CSV,
with no extension, or a folder) is read; both inputs, neither, or an artifact of an unknown kind
is one line naming what to give."""

from __future__ import annotations

import bz2
import os
import pickle
import shutil
from pathlib import Path

import pandas as pd
import pytest
from kfp import dsl

from components.fingerprint import fingerprint as fingerprint_component
from components.preprocess import preprocess as preprocess_component
from trainer.base.errors import InputError
from trainer.steps.preprocess import table_location, write_demo_data


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("demo") / "churn.parquet"
    write_demo_data(str(path), rows=300, task="classification", seed=0)
    return path


def _artifact(tmp_path: Path, demo: Path, kind: str) -> Path:
    """The demo table as a user's component writes a Dataset: KFP names the path ``table``."""
    out = tmp_path / "make-table" / "table"
    out.parent.mkdir(parents=True)
    frame = pd.read_parquet(demo)
    if kind == "parquet":
        frame.to_parquet(out)
    elif kind == "csv":
        frame.to_csv(out, index=False)
    elif kind == "folder":
        out.mkdir()
        frame.iloc[:150].to_parquet(out / "part-0.parquet")
        frame.iloc[150:].to_parquet(out / "part-1.parquet")
    elif kind == "pickle":
        out.write_bytes(pickle.dumps(frame))
    return out


def _preprocess(tmp_path: Path, **inputs: object) -> dsl.Dataset:
    dataset = dsl.Dataset(uri=str(tmp_path / "preprocess" / "dataset"))
    preprocess_component.python_func(
        target="churned",
        dataset=dataset,
        stats=dsl.Metrics(uri=str(tmp_path / "preprocess" / "stats")),
        **inputs,
    )
    return dataset


@pytest.mark.parametrize("kind", ["parquet", "csv", "folder"])
def test_preprocess_reads_a_dataset_artifact_of_each_kind(
    kind: str, demo: Path, tmp_path: Path
) -> None:
    table = _artifact(tmp_path, demo, kind)
    out = _preprocess(tmp_path, data=dsl.Dataset(uri=str(table)))
    assert {"train.parquet", "val.parquet", "test.parquet", "schema.json"} <= set(
        os.listdir(out.path)
    )
    assert out.metadata["task"] == "classification"


def test_fingerprint_of_an_artifact_is_its_content_not_its_download_time(
    demo: Path, tmp_path: Path
) -> None:
    """KFP's launcher downloads the artifact into each step's pod: fingerprint's copy and
    preprocess's have different modification times and the same bytes."""
    table = _artifact(tmp_path, demo, "parquet")
    fp = fingerprint_component.python_func(data=dsl.Dataset(uri=str(table)))
    copy = tmp_path / "other-pod" / "table"
    copy.parent.mkdir()
    shutil.copyfile(table, copy)
    os.utime(copy, ns=(1, 1))
    assert fingerprint_component.python_func(data=dsl.Dataset(uri=str(copy))) == fp
    # As data_uri the time counts (a file replaced in place must change the cache key).
    by_uri = fingerprint_component.python_func
    assert by_uri(data_uri=str(copy)) != by_uri(data_uri=str(table))
    out = _preprocess(tmp_path, data=dsl.Dataset(uri=str(copy)), data_fingerprint=fp)
    assert os.path.isdir(out.path)


BAD = {
    "both": (
        {"data": True, "data_uri": True},
        "E_PARAM: give the table once: the Dataset artifact input 'data' or data_uri, not both",
    ),
    "neither": (
        {},
        "E_PARAM: no table: give the Dataset artifact input 'data' (an upstream step's output) "
        "or data_uri",
    ),
    "pickle": (
        {"data": "pickle"},
        "E_DATA: the Dataset artifact is neither Parquet nor CSV text (it starts with bytes 80 ",
    ),
    "nothing written": (
        {"data": "missing"},
        "E_DATA: the Dataset artifact has no file or folder: the upstream step wrote nothing",
    ),
}


@pytest.mark.parametrize("step", ["preprocess", "fingerprint"])
@pytest.mark.parametrize("case", list(BAD), ids=str)
def test_bad_table_inputs_are_one_line_naming_both_inputs(
    step: str, case: str, demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    given, expected = BAD[case]
    inputs: dict[str, object] = {}
    if given.get("data") is True:
        inputs["data"] = dsl.Dataset(uri=str(_artifact(tmp_path, demo, "parquet")))
    elif given.get("data") == "pickle":
        inputs["data"] = dsl.Dataset(uri=str(_artifact(tmp_path, demo, "pickle")))
    elif given.get("data") == "missing":
        inputs["data"] = dsl.Dataset(uri=str(tmp_path / "make-table" / "table"))
    if given.get("data_uri"):
        inputs["data_uri"] = str(demo)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        if step == "preprocess":
            _preprocess(tmp_path, **inputs)
        else:
            fingerprint_component.python_func(**inputs)
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"ERROR [{step}] {expected}"), line
    assert not (tmp_path / "preprocess" / "dataset").exists(), "nothing is written"


@pytest.mark.parametrize(
    ("head", "ok"),
    [
        (b"PAR1" + b"\0" * 100, True),
        (b"a,b,y\n1,2,0\n", True),
        ("naïve;price\ncafé;1,5\n".encode("latin-1"), True),
        (b"\x1f\x8b\x08\x00" + b"\0" * 50, True),  # gzip-compressed CSV
        (b"", True),  # empty: the CSV reader's own E_EMPTY line
        (b"\x93NUMPY\x01\x00v\x00{'descr': '<f8'", False),
        (bytes(range(256)) * 4, False),
        (bz2.compress(b"a,b,y\n1,2,0\n" * 50), False),  # bzip2 is told by a name only
    ],
    ids=["parquet", "csv", "latin-1 csv", "gzip", "empty", "numpy", "binary", "bzip2 unnamed"],
)
def test_an_artifact_file_is_told_by_its_first_bytes(head: bytes, ok: bool, tmp_path: Path) -> None:
    path = tmp_path / "table"
    path.write_bytes(head)
    if ok:
        assert table_location(str(path), "") == str(path)
    else:
        with pytest.raises(InputError) as e:
            table_location(str(path), "")
        assert e.value.code == "E_DATA" and str(path) in e.value.where


def test_data_uri_alone_is_read_as_before(demo: Path) -> None:
    assert table_location(None, str(demo)) == str(demo)
