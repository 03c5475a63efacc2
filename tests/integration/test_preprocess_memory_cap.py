"""Preprocess under a real memory cap (a cgroup v1 memory limit on the process): a table ten
times larger in memory than ``preprocess.memory_budget`` goes through, as Parquet and as CSV,
where the in-memory path is killed by the kernel under the same cap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from trainer.base.memory import MIN_BUDGET
from trainer.steps.preprocess import make_demo_table

pytestmark = pytest.mark.integration

CGROUP_V1 = Path("/sys/fs/cgroup/memory")
BUDGET = MIN_BUDGET  # 16 MiB
CAP = 288 << 20
"""The process's hard limit: the interpreter with numpy, pyarrow and pandas loaded is ~110 MiB
of it; the in-memory path needs ~5x the table (over 800 MiB here)."""
ROWS = 2_100_000
"""About 163 MiB as an Arrow table: ten times the budget."""


@contextmanager
def memory_cgroup(limit: int) -> Iterator[Path]:
    """A fresh cgroup v1 memory group limited to ``limit`` bytes (removed afterwards)."""
    path = CGROUP_V1 / f"gpupipe-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as e:
        pytest.skip(f"cannot create a memory cgroup under {CGROUP_V1} ({e}): needs root, cgroup v1")
    try:
        (path / "memory.limit_in_bytes").write_text(str(limit))
        swap = path / "memory.memsw.limit_in_bytes"
        if swap.exists():
            swap.write_text(str(limit))
        yield path
    finally:
        path.rmdir()


def _preprocess_capped(
    cgroup: Path, data: Path, out: Path, budget: int
) -> subprocess.CompletedProcess[str]:
    """``python -m trainer preprocess`` run inside ``cgroup`` (the shell joins it, then execs)."""
    argv = [
        sys.executable, "-m", "trainer", "preprocess", "--data", str(data), "--output", str(out),
        "--set", "target=churned", "--set", f"memory_budget={budget}",
    ]  # fmt: skip
    script = f'echo $$ > {cgroup}/cgroup.procs && exec "$@"'
    return subprocess.run(
        ["sh", "-c", script, "sh", *argv], capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not CGROUP_V1.is_dir():
        pytest.skip(f"no cgroup v1 memory hierarchy at {CGROUP_V1}")
    root = tmp_path_factory.mktemp("capped")
    table = make_demo_table(ROWS, seed=0)
    assert table.nbytes >= 10 * BUDGET
    pq.write_table(table, root / "data.parquet")
    pacsv.write_csv(table, root / "data.csv")
    return {"parquet": root / "data.parquet", "csv": root / "data.csv"}


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_table_ten_times_the_budget_goes_through_under_the_cap(
    tables: dict[str, Path], tmp_path: Path, fmt: str
) -> None:
    with memory_cgroup(CAP) as cgroup:
        done = _preprocess_capped(cgroup, tables[fmt], tmp_path / "out", BUDGET)
        peak = int((cgroup / "memory.max_usage_in_bytes").read_text())
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["train_rows"] + result["val_rows"] + result["test_rows"] == ROWS
    assert peak <= CAP
    train = pq.ParquetFile(tmp_path / "out" / "train.parquet")
    assert train.metadata.num_rows == result["train_rows"]
    assert train.metadata.num_row_groups > 1  # written a row group at a time


def test_the_in_memory_path_is_killed_under_the_same_cap(
    tables: dict[str, Path], tmp_path: Path
) -> None:
    """The cap is real: the same table through the in-memory path (a budget it fits in) dies."""
    with memory_cgroup(CAP) as cgroup:
        done = _preprocess_capped(cgroup, tables["parquet"], tmp_path / "out", 64 << 30)
    assert done.returncode in (-9, 137), (done.returncode, done.stderr[-2000:])
    assert not (tmp_path / "out").exists()


PIPELINE_CAP = 3 << 30
"""The whole run's limit: every process of it (kfp.local's tasks, torchrun and its worker, the
registry) shares it, and the training processes import torch."""


@pytest.mark.slow  # a whole pipeline run on 2.1M rows
def test_the_whole_local_pipeline_succeeds_on_a_table_ten_times_the_budget(
    tables: dict[str, Path], tmp_path: Path
) -> None:
    """``gpupipe run --local`` in a memory cgroup: preprocess streams the table (16 MiB budget,
    ten times smaller than the table), train and evaluate read its row-group shards."""
    gpupipe = Path(sys.executable).with_name("gpupipe")
    root = tmp_path / "root"
    argv = [
        str(gpupipe), "run", "--local", "--root", str(root), "--json",
        "--data", str(tables["parquet"]), "--target", "churned",
        "--param", "epochs=1",
        "--param", json.dumps({"memory_budget": BUDGET}).join(["preprocess_config_json=", ""]),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["OMP_NUM_THREADS"] = "1"
    with memory_cgroup(PIPELINE_CAP) as cgroup:
        script = f'echo $$ > {cgroup}/cgroup.procs && exec "$@"'
        done = subprocess.run(
            ["sh", "-c", script, "sh", *argv],
            capture_output=True, text=True, timeout=1800, cwd=tmp_path, env=env,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["state"] == "SUCCEEDED"
    assert summary["metrics"]["accuracy"] > 0.6, summary["metrics"]
    (train,) = root.rglob("train.parquet")
    meta = pq.ParquetFile(train).metadata
    # The streaming path's row groups (the budget's); the whole-table path writes 131,072-row ones.
    assert meta.num_rows > 1_000_000
    assert meta.row_group(0).num_rows < 131_072
