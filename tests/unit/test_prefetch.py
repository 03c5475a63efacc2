"""The prefetching data path: same batches as the plain stream, errors surface, it stops cleanly."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from trainer.base.typedconfig import apply_overrides, from_dict
from trainer.config import WorkerConfig
from trainer.data.datasets import BatchStream, DataPosition, TokenDataset
from trainer.data.prefetch import Prefetcher
from trainer.demo import make_table
from trainer.distributed import dist
from trainer.training.loop import train

CPU = torch.device("cpu")
TORCHRUN_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "TORCHELASTIC_RUN_ID",
    "PET_NNODES",
    "GROUP_RANK",
    "GPUPIPE_JOB",
)


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpupipe-prefetch"]


def stream(start: DataPosition | None = None, *, shuffle: bool = True) -> BatchStream:
    tokens = torch.arange(10 * 16 + 1) % 97
    ds = TokenDataset(tokens, seq_len=16, vocab_size=97)
    return BatchStream(
        ds,
        global_batch_size=4,
        rank=0,
        world_size=1,
        seed=3,
        shuffle=shuffle,
        start=start or DataPosition(),
    )


def take(it: Iterator[tuple[Any, torch.Tensor, torch.Tensor]], n: int) -> list[Any]:
    return [next(it) for _ in range(n)]


def assert_same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for (pa_, xa, ya), (pb, xb, yb) in zip(a, b, strict=True):
        assert pa_ == pb
        assert torch.equal(xa.cpu(), xb) and torch.equal(ya.cpu(), yb)


@pytest.mark.parametrize("depth", [1, 2, 5], ids=["depth1", "depth2", "depth5"])
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "in-order"])
def test_same_batches_and_positions_as_the_plain_stream(depth: int, shuffle: bool) -> None:
    # 2 batches per epoch: 7 steps cross three epoch boundaries.
    plain = take(iter(stream(shuffle=shuffle)), 7)
    with Prefetcher(iter(stream(shuffle=shuffle)), device=CPU, depth=depth) as batches:
        assert_same(take(batches, 7), plain)


def test_restart_from_a_position_matches_the_plain_stream() -> None:
    """What a rollback does: drop the prefetcher mid-stream, start again from a saved position."""
    first = Prefetcher(iter(stream()), device=CPU)
    consumed = take(first, 3)
    first.close()  # it had read ahead; those batches are dropped, not skipped
    saved = consumed[1][0]  # roll back to the position after the second step
    with Prefetcher(iter(stream(saved)), device=CPU) as again:
        assert_same(take(again, 4), take(iter(stream(saved)), 4))
    assert_same(consumed, take(iter(stream()), 3))


def test_a_finite_source_ends_the_iteration() -> None:
    source = [(i, torch.full((2,), i), torch.full((2,), -i)) for i in range(3)]
    with Prefetcher(iter(source), device=CPU) as batches:
        got = list(batches)
        assert [p for p, _, _ in got] == [0, 1, 2]
        with pytest.raises(StopIteration):
            next(batches)


def test_an_error_in_the_source_reaches_the_consumer_after_the_good_batches() -> None:
    def failing() -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        for i in range(2):
            yield i, torch.zeros(1), torch.zeros(1)
        raise ValueError("row group 7 of train.parquet is corrupt")

    batches = Prefetcher(failing(), device=CPU)
    assert [p for p, _, _ in take(batches, 2)] == [0, 1]
    with pytest.raises(ValueError, match=r"row group 7 of train\.parquet is corrupt"):
        next(batches)
    assert not prefetch_threads()
    with pytest.raises(StopIteration):
        next(batches)


@pytest.mark.timeout(10)
def test_close_stops_a_producer_blocked_on_a_full_queue() -> None:
    batches = Prefetcher(iter(stream()), device=CPU, depth=2)  # an endless stream
    next(batches)
    time.sleep(0.1)  # the thread fills the queue and blocks
    start = time.perf_counter()
    batches.close()
    batches.close()  # twice is fine
    assert time.perf_counter() - start < 2.0
    assert not prefetch_threads()
    with pytest.raises(StopIteration):
        next(batches)


@pytest.mark.timeout(10)
def test_close_waits_for_a_slow_read_then_stops() -> None:
    reads = []

    def slow() -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        i = 0
        while True:
            time.sleep(0.2)
            reads.append(i)
            yield i, torch.zeros(1), torch.zeros(1)
            i += 1

    with Prefetcher(slow(), device=CPU) as batches:
        next(batches)
    assert not prefetch_threads()
    n = len(reads)
    time.sleep(0.3)
    assert len(reads) == n  # nothing reads after close


def test_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="prefetch depth must be >= 1, got 0"):
        Prefetcher(iter(stream()), device=CPU, depth=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batches_arrive_on_the_device_unchanged() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    plain = take(iter(stream()), 5)
    with Prefetcher(iter(stream()), device=device) as batches:
        got = take(batches, 5)
    assert all(x.device == device and y.device == device for _, x, y in got)
    assert_same(got, plain)


# ------------------------------------------------------------------------- inside train()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("data")
    pq.write_table(make_table(512, features=6, classes=3, seed=1), tmp / "train.parquet")
    return str(tmp / "train.parquet")


def nan_run(tmp: Path, data: str, *, prefetch: bool) -> WorkerConfig:
    """A run whose loss turns NaN once at step 11, so it rolls back to the step-8 checkpoint."""
    base = {
        "data": {"train_uri": data, "target": "label"},
        "model": {
            "name": "tests.plugins.faults:nan",
            "hidden_dim": 16,
            "num_layers": 1,
            "options": {"at": 11, "marker": str(tmp / "nan-fired")},
        },
        "optim": {"lr": 1e-2, "warmup_steps": 2},
        "train": {
            "epochs": 2,
            "global_batch_size": 64,
            "log_every_steps": 4,
            "seed": 5,
            "prefetch": prefetch,
        },
        "checkpoint": {"uri": str(tmp / "ckpt"), "every_steps": 8},
        "output": {"model_uri": str(tmp / "model")},
    }
    return from_dict(WorkerConfig, apply_overrides(base, {}))


def test_train_is_bitwise_the_same_with_and_without_prefetch_across_a_rollback(
    tmp_path: Path, data: str, ctx: dist.DistContext
) -> None:
    results, weights = {}, {}
    for prefetch in (True, False):
        tmp = tmp_path / f"prefetch-{prefetch}"
        results[prefetch] = train(nan_run(tmp, data, prefetch=prefetch), ctx)
        weights[prefetch] = load_file(tmp / "model" / "model.safetensors")
        assert (tmp / "nan-fired").exists()
    assert results[True].rollbacks == results[False].rollbacks == 1
    assert results[True].metrics == results[False].metrics
    assert weights[True].keys() == weights[False].keys()
    assert all(torch.equal(weights[True][k], weights[False][k]) for k in weights[True])
    assert not prefetch_threads()


def test_a_failing_run_leaves_no_prefetch_thread(
    tmp_path: Path, data: str, ctx: dist.DistContext
) -> None:
    cfg = nan_run(tmp_path, data, prefetch=True)
    cfg.model.name = "tests.plugins.faults:nan_always"
    cfg.train.max_nan_rollbacks = 0
    with pytest.raises(RuntimeError, match="after 0 rollbacks"):
        train(cfg, ctx)
    assert not prefetch_threads()
