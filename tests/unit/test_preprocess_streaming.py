"""Tests for preprocess in bounded memory: the streaming path gives the in-memory path's splits
(row for row) and features (allclose), reads CSV (plain and compressed) and Hive-partitioned
folders, the exact streamed median equals numpy's, and the memory budget is read and checked."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from trainer.base import memory
from trainer.base.errors import InputError
from trainer.base.typedconfig import from_dict
from trainer.steps.preprocess import (
    PreprocessConfig,
    encode,
    make_demo_table,
    preprocess,
    preview,
    stream,
    stream_stats,
)
from trainer.steps.preprocess.encode import split_indices, split_labels
from trainer.steps.preprocess.preview import inspect_data
from trainer.steps.preprocess.quantile import MedianSelect, order_keys
from trainer.steps.preprocess.step import needs_streaming
from trainer.steps.preprocess.stream import preprocess_streaming
from trainer.steps.preprocess.tabular import CsvOptions, read_columns

SPLITS = ("train", "val", "test")
TARGETS = {"classification": "churned", "regression": "spend"}


def _cfg(task: str, **extra: Any) -> PreprocessConfig:
    return from_dict(PreprocessConfig, {"target": TARGETS[task], **extra})


def _assert_same_outputs(a: Path, b: Path, *, stats: bool = True) -> None:
    """The splits equal row for row (the target exactly, every feature allclose), the fitted
    statistics equal (medians and categories exactly, moments to float rounding)."""
    for split in SPLITS:
        ta, tb = pq.read_table(a / f"{split}.parquet"), pq.read_table(b / f"{split}.parquet")
        assert ta.schema == tb.schema
        assert ta.num_rows == tb.num_rows
        for name in ta.column_names:
            xa, xb = ta[name].to_numpy(), tb[name].to_numpy()
            if xa.dtype.kind == "i":
                assert np.array_equal(xa, xb), (split, name)
            else:
                assert np.allclose(xa, xb, rtol=1e-6, atol=1e-6), (split, name)
    sa, sb = (json.loads((p / "schema.json").read_text()) for p in (a, b))
    for key in ("features", "task", "classes", "splits", "dropped", "decisions", "data_hash"):
        assert sa[key] == sb[key], key
    for ca, cb in zip(sa["columns"], sb["columns"], strict=True):
        exact = {k: v for k, v in ca.items() if k not in ("mean", "std")}
        assert exact == {k: v for k, v in cb.items() if k not in ("mean", "std")}
        if ca["kind"] == "numeric":
            assert ca["mean"] == pytest.approx(cb["mean"], rel=1e-12, abs=1e-12)
            assert ca["std"] == pytest.approx(cb["std"], rel=1e-12)
    ta_, tb_ = (json.loads((p / "stats.json").read_text()) for p in (a, b))
    assert ta_["rows"] == tb_["rows"]
    assert not stats or _close(ta_, tb_)


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        return all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-12, abs=1e-12)
        return True
    assert a == b
    return True


def _write(table: pa.Table, path: Path, fmt: str) -> Path:
    if fmt == "parquet":
        pq.write_table(table, path.with_suffix(".parquet"), row_group_size=700)
        return path.with_suffix(".parquet")
    pacsv.write_csv(table, path.with_suffix(".csv"))
    if fmt == "csv.gz":
        out = path.with_suffix(".csv.gz")
        out.write_bytes(gzip.compress(path.with_suffix(".csv").read_bytes()))
        path.with_suffix(".csv").unlink()
        return out
    return path.with_suffix(".csv")


@pytest.mark.parametrize("task", ["classification", "regression"])
@pytest.mark.parametrize("fmt", ["parquet", "csv", "csv.gz"])
def test_streaming_equals_in_memory(tmp_path: Path, task: str, fmt: str) -> None:
    data = _write(make_demo_table(6000, task=task, seed=3), tmp_path / "data", fmt)
    cfg = _cfg(task)
    mem = preprocess(cfg, data_uri=str(data), output_uri=str(tmp_path / "mem"))
    # 16 MiB: batches of a few thousand rows, several row groups per split.
    streamed = preprocess_streaming(
        cfg, data_uri=str(data), output_uri=str(tmp_path / "stream"), fingerprint="",
        budget=16 << 20,
    )  # fmt: skip
    assert streamed == mem
    _assert_same_outputs(tmp_path / "mem", tmp_path / "stream")


def test_small_budget_streams_and_counts_missing_medians(tmp_path: Path) -> None:
    """A budget below the table's in-memory size sends preprocess down the streaming path;
    its imputation medians (columns with gaps) are the in-memory path's, exactly."""
    data = _write(make_demo_table(6000, seed=5), tmp_path / "data", "parquet")
    assert needs_streaming(str(data), memory.MIN_BUDGET) is False  # 6000 rows fit 16 MiB
    big = tmp_path / "big"
    big.mkdir()
    for i in range(4):
        pq.write_table(make_demo_table(30000, seed=10 + i), big / f"part-{i}.parquet")
    assert needs_streaming(str(big), memory.MIN_BUDGET)
    assert not needs_streaming(str(big), memory.DEFAULT_BUDGET)
    cfg = _cfg("classification", memory_budget=memory.MIN_BUDGET)
    res = preprocess(cfg, data_uri=str(big), output_uri=str(tmp_path / "s"))
    ref = preprocess(_cfg("classification"), data_uri=str(big), output_uri=str(tmp_path / "m"))
    assert res == ref
    _assert_same_outputs(tmp_path / "m", tmp_path / "s")
    cols = json.loads((tmp_path / "s" / "schema.json").read_text())["columns"]
    assert any(c["kind"] == "numeric" and c["train_missing"] > 0 for c in cols)


def test_hive_partitioned_folder(tmp_path: Path) -> None:
    """A ``part=x/`` layout is read (it was refused as holding no data files), the partition
    key becoming a column, with the rows of the flat table in the same order."""
    table = make_demo_table(3000, seed=7)
    root = tmp_path / "hive"
    flat_parts = []
    for region in ("east", "north", "west"):
        part = table.filter(pa.compute.equal(table["region"], region)).drop_columns(["region"])
        (root / f"region={region}").mkdir(parents=True)
        pq.write_table(part, root / f"region={region}" / "part-0.parquet")
        flat_parts.append(part.append_column("region", pa.array([region] * part.num_rows)))
    flat = pa.concat_tables(flat_parts)
    pq.write_table(flat, tmp_path / "flat.parquet")
    cfg = _cfg("classification")
    res = preprocess(cfg, data_uri=str(root), output_uri=str(tmp_path / "out"))
    assert "region=east" in res.features
    ref = preprocess(cfg, data_uri=str(tmp_path / "flat.parquet"), output_uri=str(tmp_path / "m"))
    assert (res.train_rows, res.val_rows, res.test_rows) == (
        ref.train_rows, ref.val_rows, ref.test_rows,
    )  # fmt: skip
    a = pq.read_table(tmp_path / "out" / "train.parquet")
    b = pq.read_table(tmp_path / "m" / "train.parquet")
    for name in b.column_names:
        assert np.allclose(a[name].to_numpy(), b[name].to_numpy(), atol=1e-6), name


def test_hive_folder_without_data_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d" / "part=1").mkdir(parents=True)
    (tmp_path / "d" / "part=1" / "notes.md").write_text("x")
    with pytest.raises(InputError, match="holds no data files"):
        preprocess(
            _cfg("classification"), data_uri=str(tmp_path / "d"), output_uri=str(tmp_path / "o")
        )


@pytest.mark.parametrize("n", [0, 1, 7, 1000, 4099])
@pytest.mark.parametrize("stratified", [False, True], ids=["plain", "stratified"])
@pytest.mark.parametrize("seed", [0, 11])
def test_split_labels_equal_split_indices(
    monkeypatch: pytest.MonkeyPatch, n: int, stratified: bool, seed: int
) -> None:
    monkeypatch.setattr(encode, "SPLIT_CHUNK", 97)  # many chunks: the class ranks carry over
    rng = np.random.default_rng(n + seed)
    classes = rng.integers(0, 5, n) if stratified else None
    want = split_indices(n, classes=classes, val_fraction=0.15, test_fraction=0.2, seed=seed)
    got = split_labels(n, classes=classes, val_fraction=0.15, test_fraction=0.2, seed=seed)
    assert got.dtype == np.int8
    for i, rows in enumerate(want):
        assert np.array_equal(np.flatnonzero(got == i), rows)


def _streamed_median(x: np.ndarray, cap: int, batch: int = 1000) -> tuple[float, int]:
    sel = MedianSelect(cap=cap)
    passes = 0
    done = False
    while not done:
        for lo in range(0, x.size, batch):
            sel.feed(order_keys(x[lo : lo + batch]))
        passes += 1
        done = sel.end_pass()
    return sel.value, passes


@pytest.mark.parametrize(
    "values",
    [
        np.random.default_rng(0).normal(50, 20, 10001),
        np.random.default_rng(1).lognormal(0, 3, 10000),
        np.random.default_rng(2).integers(-5, 5, 9999).astype(np.float64),  # many ties
        np.concatenate([np.full(5000, 1.5), np.full(5000, 1.5000000000000002)]),
        np.array([-0.5, 3.0]),
        np.array([7.25]),
        np.random.default_rng(3).uniform(-1e30, 1e30, 4000),
    ],
    ids=["normal-odd", "lognormal-even", "integer-ties", "adjacent-floats", "two", "one", "huge"],
)
@pytest.mark.parametrize("cap", [1, 64, 1 << 20], ids=["cap1", "cap64", "cap1M"])
def test_streamed_median_is_exact(values: np.ndarray, cap: int) -> None:
    """The median of the streamed selection is numpy's, bit for bit, whatever the cap (a small
    cap only costs passes: at most five, a key having 64 bits)."""
    got, passes = _streamed_median(values, cap)
    assert got == float(np.median(values))
    assert passes <= 5
    if cap == 1 << 20:
        assert passes == 2  # the histogram pass, then one pass that collects a bin


def test_order_keys_sort_like_values() -> None:
    x = np.array([3.0, -1e300, -0.0, 0.0, 2.5e-310, -2.5e-310, 1e300, -7.0, np.inf, -np.inf])
    keys = order_keys(x)
    assert np.array_equal(np.argsort(keys, kind="stable"), np.argsort(x, kind="stable"))


@pytest.mark.parametrize(
    ("files", "want"),
    [
        ({"memory.max": "max\n"}, None),
        ({"memory.max": "1073741824\n"}, 1 << 30),
        ({"memory/memory.limit_in_bytes": "9223372036854771712\n"}, None),  # v1: no limit
        ({"memory/memory.limit_in_bytes": "536870912\n"}, 512 << 20),
        ({"memory/pod/memory.limit_in_bytes": "268435456\n"}, 256 << 20),  # own cgroup
        (
            {
                "memory/pod/memory.limit_in_bytes": "268435456\n",
                "memory/memory.limit_in_bytes": "9223372036854771712\n",
            },
            256 << 20,
        ),
        ({}, None),
    ],
    ids=["v2-max", "v2-limit", "v1-unlimited", "v1-limit", "v1-own", "v1-own-first", "none"],
)
def test_cgroup_memory_limit(tmp_path: Path, files: dict[str, str], want: int | None) -> None:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("4:memory:/pod\n1:cpu:/\n")
    assert memory.cgroup_memory_limit(tmp_path, proc) == want


def test_default_budget_follows_the_limit() -> None:
    assert memory.default_memory_budget(1 << 30) == 512 << 20
    assert memory.default_memory_budget(1 << 20) == memory.MIN_BUDGET
    # What is in use already (the interpreter, KFP's launcher) is not the data's.
    assert memory.default_memory_budget(256 << 20, in_use=128 << 20) == 64 << 20
    assert memory.default_memory_budget(256 << 20, in_use=300 << 20) == memory.MIN_BUDGET


@pytest.mark.parametrize(
    ("files", "want"),
    [
        ({"memory.stat": "anon 104857600\nfile 5\n"}, 100 << 20),  # v2
        ({"memory/pod/memory.stat": "cache 7\nrss 1\ntotal_rss 52428800\n"}, 50 << 20),  # v1
        ({}, None),
    ],
    ids=["v2", "v1-own", "none"],
)
def test_cgroup_memory_in_use(tmp_path: Path, files: dict[str, str], want: int | None) -> None:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("4:memory:/pod\n1:cpu:/\n" if "memory/pod" in str(files) else "0::/\n")
    assert memory.cgroup_memory_in_use(tmp_path, proc) == want


@pytest.mark.parametrize("bad", [0, 1 << 20, -5, "1GiB"])
def test_memory_budget_is_checked(bad: Any) -> None:
    with pytest.raises(ValueError, match="memory_budget"):
        from_dict(PreprocessConfig, {"target": "y", "memory_budget": bad})


def test_memory_budget_default_is_read_at_run_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "cgroup_memory_limit", lambda *a: 256 << 20)
    monkeypatch.setattr(memory, "cgroup_memory_in_use", lambda *a: 0)
    assert PreprocessConfig(target="y").budget() == 128 << 20
    assert PreprocessConfig(target="y", memory_budget=64 << 20).budget() == 64 << 20


def test_read_columns_decompresses_only_the_head(tmp_path: Path) -> None:
    """The pre-run check reads a compressed CSV's header from its first bytes: a file whose
    tail is damaged still gives its columns (the whole file is never decompressed)."""
    text = "a,b,churned\n" + "1,x,yes\n" * 300_000
    whole = gzip.compress(text.encode())
    path = tmp_path / "data.csv.gz"
    path.write_bytes(whole[: len(whole) // 2])  # cut: decompressing all of it fails
    assert read_columns(str(path), CsvOptions()) == ["a", "b", "churned"]


def test_read_columns_of_a_hive_folder_names_the_partition_keys(tmp_path: Path) -> None:
    for day in ("1", "2"):
        (tmp_path / f"day={day}").mkdir()
        pq.write_table(pa.table({"x": [1.0, 2.0]}), tmp_path / f"day={day}" / "p.parquet")
    assert read_columns(str(tmp_path), CsvOptions()) == ["x", "day"]


@pytest.mark.parametrize("fmt", ["parquet", "csv", "csv.gz"])
def test_pre_run_check_reads_only_the_first_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """inspect_data reads the target of the first CHECK_ROWS rows only: a missing target value
    after them is preprocess's to find, not the check's (which would have read it all)."""
    table = make_demo_table(3000, seed=2)
    target = table["churned"].to_pylist()
    target[2500] = None
    table = table.set_column(table.schema.get_field_index("churned"), "churned", pa.array(target))
    data = _write(table, tmp_path / "data", fmt)
    cfg = _cfg("classification")
    with pytest.raises(InputError, match="missing values"):
        inspect_data(str(data), cfg)
    monkeypatch.setattr(preview, "CHECK_ROWS", 2000)
    notes = inspect_data(str(data), cfg)
    assert any(n.code == "I_TASK" for n in notes)


def test_category_counts_past_the_cap_keep_the_frequent_categories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past CATEGORY_CAP distinct values the rarest half of the counts is forgotten: the kept
    top categories are still the frequent ones (here those of the exact count), the rest
    ``__other__``."""
    rng = np.random.default_rng(0)
    n = 20_000
    common = rng.choice(["a", "b", "c"], n)
    rare = np.array([f"r{i}" for i in rng.integers(0, 5000, n)])
    city = np.where(rng.random(n) < 0.7, common, rare)
    table = pa.table({"city": city, "x": rng.normal(size=n), "y": rng.choice(["p", "q"], n)})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=1000)
    monkeypatch.setattr(stream_stats, "CATEGORY_CAP", 64)
    monkeypatch.setattr(stream, "MIN_BATCH_ROWS", 500)
    cfg = from_dict(PreprocessConfig, {"target": "y", "max_categories": 3})
    res = preprocess_streaming(
        cfg, data_uri=str(tmp_path / "d.parquet"), output_uri=str(tmp_path / "o"),
        fingerprint="", budget=16 << 20,
    )  # fmt: skip
    assert [f for f in res.features if f.startswith("city=")] == [
        "city=a", "city=b", "city=c", "city=__other__",
    ]  # fmt: skip
    ref = preprocess(cfg, data_uri=str(tmp_path / "d.parquet"), output_uri=str(tmp_path / "m"))
    assert res.features == ref.features
    _assert_same_outputs(tmp_path / "m", tmp_path / "o", stats=False)
    exact = json.loads((tmp_path / "m" / "stats.json").read_text())["columns"]["city"]
    lossy = json.loads((tmp_path / "o" / "stats.json").read_text())["columns"]["city"]
    assert lossy["approximate"] is True
    assert (lossy["count"], lossy["missing"]) == (exact["count"], exact["missing"])
    assert lossy["distinct"] < exact["distinct"]
    assert lossy["top"][:3] == exact["top"][:3]  # the frequent values, counted in full


@pytest.mark.parametrize("streaming", [False, True], ids=["in-memory", "streaming"])
def test_labels_differing_only_in_spaces_or_case_are_named_with_their_counts(
    tmp_path: Path, streaming: bool
) -> None:
    """Issue 60, item 14: tried as a new user would, a hand-edited export with ``yes`` and
    ``yes `` made classes ``no``, ``yes``, ``yes `` without a word."""
    rng = np.random.default_rng(0)
    labels = np.array(["no", "yes", "yes ", "Yes"], dtype=object)[rng.integers(0, 4, 2000)]
    table = pa.table({"x": rng.normal(size=2000), "y": pa.array(labels.tolist())})
    data = _write(table, tmp_path / "data", "csv")
    cfg = from_dict(PreprocessConfig, {"target": "y"})
    out = tmp_path / "out"
    if streaming:
        preprocess_streaming(cfg, data_uri=str(data), output_uri=str(out), fingerprint="",
                             budget=16 << 20)  # fmt: skip
    else:
        preprocess(cfg, data_uri=str(data), output_uri=str(out))
    schema = json.loads((out / "schema.json").read_text())
    assert schema["classes"] == ["Yes", "no", "yes", "yes "]  # still what the data says
    (line,) = [w for w in schema["warnings"] if "W_LABELS" in w]
    counts = {v: int((labels == v).sum()) for v in ("Yes", "yes", "yes ")}
    for label, n in counts.items():
        assert f"{label!r} ({n} rows)" in line, line
    assert "'no'" not in line and "merge them in the data" in line


def test_distinct_labels_raise_no_label_warning(tmp_path: Path) -> None:
    table = pa.table({"x": [0.1, 0.2, 0.3, 0.4] * 50, "y": ["no", "yes", "maybe", "no"] * 50})
    data = _write(table, tmp_path / "data", "parquet")
    preprocess(from_dict(PreprocessConfig, {"target": "y"}), data_uri=str(data),
               output_uri=str(tmp_path / "out"))  # fmt: skip
    schema = json.loads((tmp_path / "out" / "schema.json").read_text())
    assert not [w for w in schema["warnings"] if "W_LABELS" in w]
