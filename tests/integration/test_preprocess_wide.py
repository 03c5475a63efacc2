"""Preprocess by three real worker processes (torchrun, gloo, CPU): a multi-file Parquet and a
multi-file CSV dataset give one process's result bit for bit, also with fewer files than
workers; a bad value in a file only the last rank reads ends every rank with the same one line,
exit 2, and nothing published."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import demo_parts
from trainer.base.typedconfig import from_dict
from trainer.steps.preprocess import (
    PreprocessConfig,
    data_fingerprint,
    preprocess,
)
from trainer.steps.preprocess.stream import preprocess_streaming

pytestmark = pytest.mark.integration

SPLITS = ("train", "val", "test")
BUDGET = 64 << 20


def _dataset(root: Path, fmt: str, task: str, sizes: list[int]) -> Path:
    return demo_parts(root, fmt, task, sizes, seed=9, row_group_size=600)


@pytest.mark.parametrize(
    ("fmt", "task", "sizes"),
    [
        ("parquet", "classification", [2500, 900, 3100, 1200, 1800]),
        ("csv", "regression", [4200, 3300]),
    ],
    ids=["parquet-5-files", "csv-2-files-fewer-than-workers"],
)
def test_three_workers_equal_one_process(
    tmp_path: Path, fmt: str, task: str, sizes: list[int]
) -> None:
    data = _dataset(tmp_path / "data", fmt, task, sizes)
    target = "churned" if task == "classification" else "spend"
    one = from_dict(PreprocessConfig, {"target": target})
    want = preprocess_streaming(
        one, data_uri=str(data), output_uri=str(tmp_path / "one"),
        fingerprint=data_fingerprint(str(data)), budget=BUDGET,
    )  # fmt: skip
    wide = from_dict(
        PreprocessConfig, {"target": target, "workers": 3, "memory_budget": 3 * BUDGET}
    )
    got = preprocess(wide, data_uri=str(data), output_uri=str(tmp_path / "wide"))
    assert got == want
    for split in SPLITS:
        a = pq.read_table(tmp_path / "one" / f"{split}.parquet")
        b = pq.read_table(tmp_path / "wide" / f"{split}.parquet")
        assert a.num_rows > 0 and a.equals(b), split  # row for row, bit for bit
    for doc in ("schema.json", "stats.json"):
        a_doc = json.loads((tmp_path / "one" / doc).read_text())
        b_doc = json.loads((tmp_path / "wide" / doc).read_text())
        assert a_doc == b_doc, doc


def _bad_last_file(tmp_path: Path) -> Path:
    data = _dataset(tmp_path / "data", "parquet", "classification", [1500, 1500, 1500])
    rows = pq.read_table(data / "part-02.parquet").to_pylist()
    rows[40]["churned"] = None
    pq.write_table(pa.Table.from_pylist(rows), data / "part-02.parquet")
    return data


def test_bad_value_in_the_last_workers_file_fails_the_step_in_one_line(tmp_path: Path) -> None:
    data = _bad_last_file(tmp_path)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "preprocess", "--data", str(data), "--output",
         str(out), "--set", "target=churned", "--set", "workers=3"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ERROR [preprocess] E_"), lines[0]
    assert "part-02.parquet" in lines[0] and "row 41" in lines[0], lines[0]
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_every_worker_ends_with_the_same_line(tmp_path: Path) -> None:
    data = _bad_last_file(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"target": "churned", "workers": 1}))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.launch", "--standalone", "--nproc_per_node=3",
         "-m", "trainer.steps.preprocess.wide", "--config", str(config), "--data", str(data),
         "--output", str(out), "--budget", str(BUDGET)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "ERROR [preprocess]" in line]
    assert len(errors) == 3, proc.stderr[-3000:]
    assert len({line[line.index("ERROR") :] for line in errors}) == 1
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "data"]
