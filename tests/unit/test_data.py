"""Tests for trainer.data: sharding, resume, streaming windows, evaluation coverage, validation."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from trainer.base.errors import InputError
from trainer.data import datasets, streaming
from trainer.data.datasets import (
    BatchStream,
    DataPosition,
    TabularDataset,
    TokenDataset,
    eval_batches,
    load_dataset,
)
from trainer.data.streaming import StreamingParquetDataset

ROWS = 600  # divisible by every global batch below, so an epoch visits every row
ROW_GROUP = 50


def _table(start: int, n: int, seed: int = 0) -> pa.Table:
    """Rows whose first feature `id` is the global row number, so batches can be traced."""
    rng = np.random.default_rng(seed)
    ids = np.arange(start, start + n)
    return pa.table(
        {
            "id": ids.astype(np.int64),
            "f1": rng.normal(size=n),
            "f2": rng.normal(size=n).astype(np.float32),
            "flag": ids % 2 == 0,
            "label": (ids % 3).astype(np.int64),
        }
    )


@pytest.fixture
def one_file(tmp_path: Path) -> str:
    path = tmp_path / "train.parquet"
    pq.write_table(_table(0, ROWS), path, row_group_size=ROW_GROUP)
    return str(path)


@pytest.fixture
def folder(tmp_path: Path) -> str:
    """Three files of unequal size; names sort in row order."""
    root = tmp_path / "train"
    root.mkdir()
    bounds = [0, 150, 420, ROWS]
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        pq.write_table(_table(a, b - a), root / f"part-{i}.parquet", row_group_size=ROW_GROUP)
    (root / "_SUCCESS").write_text("")
    return str(root)


def _dataset(kind: str, uri: str, window: int = 2) -> datasets.Dataset:
    if kind == "memory":
        return TabularDataset.from_parquet(uri, target="label", task="classification")
    return StreamingParquetDataset.from_parquet(
        uri, target="label", task="classification", window_row_groups=window
    )


def _take(stream: BatchStream, steps: int) -> list[tuple[DataPosition, torch.Tensor, torch.Tensor]]:
    return list(itertools.islice(stream, steps))


def _ids(x: torch.Tensor) -> list[int]:
    return x[:, 0].long().tolist()


def _all_ids(items: list[tuple[DataPosition, torch.Tensor, torch.Tensor]]) -> list[int]:
    return _ids(torch.cat([x for _, x, _ in items]))


KINDS = ["memory", "streaming"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world_size", [1, 2, 4], ids=lambda w: f"W{w}")
def test_rank_slices_concatenate_to_the_one_process_batch(
    one_file: str, kind: str, world_size: int
) -> None:
    ds = _dataset(kind, one_file)
    steps = 2 * (ROWS // 120)  # two epochs
    single = _take(BatchStream(ds, global_batch_size=120, rank=0, world_size=1, seed=7), steps)
    ranks = [
        _take(BatchStream(ds, global_batch_size=120, rank=r, world_size=world_size, seed=7), steps)
        for r in range(world_size)
    ]
    for k, (pos, x, y) in enumerate(single):
        assert len(set(_ids(x))) == 120
        xs = [ranks[r][k][1] for r in range(world_size)]
        assert all(len(part) == 120 // world_size for part in xs)
        assert torch.equal(torch.cat(xs), x)
        assert torch.equal(torch.cat([ranks[r][k][2] for r in range(world_size)]), y)
        assert all(ranks[r][k][0] == pos for r in range(world_size))


def test_epochs_reshuffle_and_positions_advance(one_file: str) -> None:
    ds = _dataset("memory", one_file)
    stream = BatchStream(ds, global_batch_size=200, rank=0, world_size=1, seed=3)
    assert stream.steps_per_epoch == 3
    items = _take(stream, 6)
    assert [p for p, _, _ in items] == [
        DataPosition(0, 1),
        DataPosition(0, 2),
        DataPosition(1, 0),
        DataPosition(1, 1),
        DataPosition(1, 2),
        DataPosition(2, 0),
    ]
    first = _all_ids(items[:3])
    second = _all_ids(items[3:])
    assert sorted(first) == sorted(second) == list(range(ROWS))
    assert first != second


def test_no_shuffle_is_file_order_and_drops_the_partial_batch(one_file: str) -> None:
    ds = _dataset("memory", one_file)
    stream = BatchStream(ds, global_batch_size=250, rank=1, world_size=2, seed=0, shuffle=False)
    assert stream.steps_per_epoch == 2
    (_, x0, _), (_, x1, _), (_, x2, _) = _take(stream, 3)
    assert _ids(x0) == list(range(125, 250))
    assert _ids(x1) == list(range(375, 500))
    assert _ids(x2) == list(range(125, 250))  # rows 500..599 dropped; epoch 1 starts over


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("world_size", "skip"),
    [(1, 0), (1, 2), (2, 4), (2, 5), (4, 9)],
    ids=["W1-start", "W1-mid-epoch", "W2-epoch-end", "W2-next-epoch", "W4-third-epoch"],
)
def test_resume_yields_the_uninterrupted_batches(
    one_file: str, kind: str, world_size: int, skip: int
) -> None:
    ds = _dataset(kind, one_file)
    rank = world_size - 1

    def stream(start: DataPosition | None = None) -> BatchStream:
        return BatchStream(
            ds,
            global_batch_size=120,
            rank=rank,
            world_size=world_size,
            seed=11,
            start=start or DataPosition(),
        )

    full = _take(stream(), skip + 8)  # 5 steps per epoch: every case crosses an epoch boundary
    saved = full[skip - 1][0] if skip else DataPosition()
    restored = DataPosition.from_dict(saved.to_dict())
    resumed = _take(stream(restored), 8)
    for (p1, x1, y1), (p2, x2, y2) in zip(full[skip:], resumed, strict=True):
        assert p1 == p2
        assert torch.equal(x1, x2)
        assert torch.equal(y1, y2)


def test_end_of_epoch_step_is_the_next_epoch(one_file: str) -> None:
    ds = _dataset("memory", one_file)
    a = BatchStream(
        ds, global_batch_size=120, rank=0, world_size=1, seed=1, start=DataPosition(0, 5)
    )
    b = BatchStream(
        ds, global_batch_size=120, rank=0, world_size=1, seed=1, start=DataPosition(1, 0)
    )
    assert torch.equal(next(iter(a))[1], next(iter(b))[1])


@pytest.mark.parametrize("source", ["one_file", "folder"])
@pytest.mark.parametrize("window", [1, 3, 100], ids=lambda w: f"window{w}")
def test_streaming_epoch_visits_every_row_once(
    request: pytest.FixtureRequest, source: str, window: int
) -> None:
    uri = request.getfixturevalue(source)
    ds = _dataset("streaming", uri, window=window)
    assert len(ds) == ROWS
    assert ds.feature_names == ["id", "f1", "f2", "flag"]
    stream = BatchStream(ds, global_batch_size=60, rank=0, world_size=1, seed=5)
    for epoch in range(2):
        items = _take(stream, stream.steps_per_epoch * (epoch + 1))[-stream.steps_per_epoch :]
        ids = _all_ids(items)
        assert sorted(ids) == list(range(ROWS))
        assert ids != list(range(ROWS))
        labels = torch.cat([y for _, _, y in items])
        assert labels.tolist() == [i % 3 for i in ids]


@pytest.mark.parametrize("source", ["one_file", "folder"])
def test_streaming_unshuffled_matches_in_memory(
    request: pytest.FixtureRequest, source: str
) -> None:
    uri = request.getfixturevalue(source)
    kw = {"global_batch_size": 80, "rank": 1, "world_size": 2, "seed": 0, "shuffle": False}
    mem = _take(BatchStream(_dataset("memory", uri), **kw), 10)
    st = _take(BatchStream(_dataset("streaming", uri), **kw), 10)
    for (p1, x1, y1), (p2, x2, y2) in zip(mem, st, strict=True):
        assert p1 == p2
        assert torch.equal(x1, x2)
        assert torch.equal(y1, y2)


@pytest.mark.parametrize("window", [1, 2, 4], ids=lambda w: f"window{w}")
def test_streaming_reads_one_window_at_a_time(
    one_file: str, monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    reads: list[int] = []
    real = streaming._read_row_group

    def spy(fs, path, index, columns):  # type: ignore[no-untyped-def]
        reads.append(index)
        return real(fs, path, index, columns)

    monkeypatch.setattr(streaming, "_read_row_group", spy)
    ds = _dataset("streaming", one_file, window=window)
    groups = ROWS // ROW_GROUP
    stream = BatchStream(ds, global_batch_size=30, rank=0, world_size=1, seed=2)
    for k, _ in enumerate(itertools.islice(stream, stream.steps_per_epoch)):
        consumed = (k + 1) * 30
        # Never ahead of the window holding the last row served.
        needed_windows = -(-consumed // (window * ROW_GROUP))
        assert len(reads) <= min(groups, needed_windows * window)
    assert sorted(reads) == list(range(groups))  # each row group read exactly once per epoch


def test_streaming_resume_reads_nothing_it_skips(
    one_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []
    real = streaming._read_row_group
    monkeypatch.setattr(
        streaming, "_read_row_group", lambda fs, p, i, c: reads.append(i) or real(fs, p, i, c)
    )
    ds = _dataset("streaming", one_file, window=2)
    start = DataPosition(0, 9)  # 9 * 60 = 540 rows in: inside the last window
    stream = BatchStream(ds, global_batch_size=60, rank=0, world_size=1, seed=4, start=start)
    next(iter(stream))
    assert len(reads) == 2


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("n_rows", "batch_size", "world_size"),
    [(ROWS, 64, 1), (ROWS, 64, 2), (ROWS, 100, 4), (ROWS, 7, 3), (ROWS, 1000, 4)],
    ids=["W1", "W2-ragged", "W4-even-shards", "W3-small-batches", "W4-one-batch"],
)
def test_eval_batches_cover_every_sample_once(
    one_file: str, kind: str, n_rows: int, batch_size: int, world_size: int
) -> None:
    ds = _dataset(kind, one_file)
    per_rank = [
        list(eval_batches(ds, batch_size=batch_size, rank=r, world_size=world_size))
        for r in range(world_size)
    ]
    assert len({len(batches) for batches in per_rank}) == 1
    seen: list[int] = []
    for batches in per_rank:
        for x, y, n_valid in batches:
            assert x.shape[0] == y.shape[0] == batch_size
            seen += _ids(x[:n_valid])
            assert _ids(x[n_valid:]) == [0] * (batch_size - n_valid)
    assert seen == list(range(n_rows))


def test_eval_batches_pad_ranks_with_no_samples(tmp_path: Path) -> None:
    path = tmp_path / "tiny.parquet"
    pq.write_table(_table(0, 3), path)
    ds = TabularDataset.from_parquet(str(path), target="label", task="classification")
    out = [list(eval_batches(ds, batch_size=2, rank=r, world_size=4)) for r in range(4)]
    assert [[n for _, _, n in batches] for batches in out] == [[1], [1], [1], [0]]


def test_tabular_dtypes_and_feature_selection(one_file: str) -> None:
    ds = TabularDataset.from_parquet(
        one_file, target="f1", features=["f2", "id"], task="regression"
    )
    assert ds.feature_names == ["f2", "id"]
    assert ds.features.dtype == torch.float32
    assert ds.features.shape == (ROWS, 2)
    assert ds.target.dtype == torch.float32
    assert ds.num_classes is None
    cls = TabularDataset.from_parquet(one_file, target="label", task="classification")
    assert cls.target.dtype == torch.int64
    assert cls.num_classes == 3
    x, y = cls.batch(torch.tensor([5, 1]))
    assert x[:, 0].tolist() == [5.0, 1.0]
    assert y.tolist() == [2, 1]


def test_streaming_num_classes_from_metadata(folder: str) -> None:
    assert _dataset("streaming", folder).num_classes == 3


def test_load_dataset_streams_what_does_not_fit(one_file: str) -> None:
    kw = {"kind": "tabular", "target": "label", "features": None, "task": "classification"}
    assert isinstance(
        load_dataset(one_file, seq_len=None, max_memory_bytes=1 << 30, **kw), TabularDataset
    )
    streamed = load_dataset(one_file, seq_len=None, max_memory_bytes=4096, **kw)
    assert isinstance(streamed, StreamingParquetDataset)
    assert streamed.window_row_groups >= 1


def _write_bad(tmp_path: Path, case: str) -> str:
    """Writes one defective dataset; returns its uri."""
    t = _table(0, 40)
    path = tmp_path / f"{case}.parquet"
    if case == "string":
        t = t.append_column("city", pa.array(["x"] * 40))
    elif case == "nan":
        t = t.set_column(1, "f1", pa.array([0.0] * 39 + [float("nan")]))
    elif case == "inf":
        t = t.set_column(2, "f2", pa.array([1.0] * 39 + [float("inf")], pa.float32()))
    elif case == "null":
        t = t.set_column(1, "f1", pa.array([1.0] * 39 + [None]))
    elif case == "negative":
        t = t.set_column(4, "label", pa.array([0] * 39 + [-1]))
    elif case == "fractional":
        t = t.set_column(4, "label", pa.array([0.0] * 38 + [1.5, 2.5]))
    elif case == "empty":
        t = t.slice(0, 0)
    elif case == "empty-folder":
        path = tmp_path / "nothing"
        path.mkdir()
        return str(path)
    pq.write_table(t, path, row_group_size=16)
    return str(path)


BAD = [
    ("missing-target", "label", {"target": "price"}, r"target column 'price' not found"),
    ("missing-feature", "label", {"features": ["f1", "nope"]}, r"feature column 'nope' not found"),
    ("string", "string", {}, r"column 'city' is string, not numeric"),
    ("nan", "nan", {}, r"feature column 'f1' contains NaN or inf"),
    ("inf", "inf", {}, r"feature column 'f2' contains NaN or inf"),
    ("null", "null", {}, r"feature column 'f1' has 1 null values"),
    ("negative-label", "negative", {}, r"must be integer-coded 0\.\.K-1, found -1"),
    ("fractional-label", "fractional", {}, r"must be integer-coded 0\.\.K-1, found 1\.5, 2\.5"),
    ("empty", "empty", {}, r"is empty: 0 rows"),
    ("empty-folder", "empty-folder", {}, r"holds no \.parquet files"),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("case", "kwargs", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_bad_data_fails_with_a_message_naming_column_and_file(
    tmp_path: Path, kind: str, case: str, kwargs: dict, message: str
) -> None:
    uri = _write_bad(tmp_path, case)
    args = {"target": "label", "task": "classification", **kwargs}
    with pytest.raises(ValueError, match=message) as err:
        if kind == "memory":
            TabularDataset.from_parquet(uri, **args)
        else:  # rows are validated as they are read
            ds = StreamingParquetDataset.from_parquet(uri, **args)
            list(
                itertools.islice(
                    BatchStream(ds, global_batch_size=8, rank=0, world_size=1, seed=0), 5
                )
            )
    assert uri in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"global_batch_size": 120, "world_size": 7},
            r"global_batch_size 120 must be divisible by world_size 7",
        ),
        (
            {"global_batch_size": 1000},
            r"dataset has 600 samples, fewer than one global batch of 1000",
        ),
        ({"rank": 2, "world_size": 2}, r"rank must be in \[0, 2\), got 2"),
        ({"start": DataPosition(0, 6)}, r"start step 6 is past the 5 steps"),
    ],
    ids=["G-not-divisible-by-W", "n-less-than-G", "rank-out-of-range", "start-past-epoch"],
)
def test_bad_batch_geometry(one_file: str, kwargs: dict, message: str) -> None:
    args = {"global_batch_size": 120, "rank": 0, "world_size": 1, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        BatchStream(_dataset("memory", one_file), **args)


def test_data_position_round_trip_and_errors() -> None:
    pos = DataPosition(epoch=3, step=17)
    assert DataPosition.from_dict(pos.to_dict()) == pos
    with pytest.raises(ValueError, match="unknown DataPosition keys: steps"):
        DataPosition.from_dict({"epoch": 1, "steps": 2})
    with pytest.raises(ValueError, match=r"DataPosition.step must be an int >= 0, got -1"):
        DataPosition(0, -1)


def test_token_dataset_shifts_targets_by_one(tmp_path: Path) -> None:
    path = tmp_path / "tokens.parquet"
    pq.write_table(pa.table({"tokens": pa.array(np.arange(41), pa.int32())}), path)
    ds = TokenDataset.from_parquet(str(path), seq_len=8)
    assert len(ds) == 5  # 41 tokens = 5 samples of 8 inputs, each with a next token
    x, y = ds.batch(torch.tensor([4, 0]))
    assert x.dtype == y.dtype == torch.int64
    assert x.shape == y.shape == (2, 8)
    assert x[0].tolist() == list(range(32, 40))
    assert y[0].tolist() == list(range(33, 41))
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert ds.vocab_size == 41


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            pa.table({"tokens": pa.array([1, 2, 3])}),
            r"is empty: 3 tokens, fewer than seq_len \+ 1 = 9",
        ),
        (pa.table({"text": pa.array([1] * 20)}), r"token column 'tokens' not found"),
        (
            pa.table({"tokens": pa.array([0.5] * 20)}),
            r"token column 'tokens' is double, not integer",
        ),
    ],
    ids=["too-short", "missing-column", "float-tokens"],
)
def test_token_dataset_errors(tmp_path: Path, table: pa.Table, message: str) -> None:
    path = tmp_path / "tokens.parquet"
    pq.write_table(table, path)
    with pytest.raises(ValueError, match=message):
        TokenDataset.from_parquet(str(path), seq_len=8)


@pytest.mark.parametrize("streamed", [False, True], ids=["in-memory", "streamed"])
def test_a_file_that_is_not_parquet_is_bad_data_naming_the_file(
    tmp_path: Path, streamed: bool
) -> None:
    # Seen on the cluster: the worker's line said only "Parquet magic bytes not found ... (train)".
    bad = tmp_path / "train.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(InputError) as info:
        if streamed:
            StreamingParquetDataset(str(bad), target="y", task="classification")
        else:
            TabularDataset.from_parquet(str(bad), target="y", task="classification")
    assert info.value.code == "E_DATA"
    assert info.value.where == str(bad)
    assert "not a readable Parquet file" in info.value.message
