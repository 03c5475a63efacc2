"""Benchmark: trainer.data's columnar Parquet batches vs a per-row torch DataLoader.

The fair unit of comparison is one epoch of training data: both pipelines read the same Parquet
file into memory once (timed), then serve every sample once, shuffled, in batches of 256 (the
trailing partial batch dropped by both). The DataLoader gets its best of num_workers 0/1/2.
Repeats are interleaved and medians reported; worker counts above 0 get fewer repeats
(``--worker-repeats``) because each of their epochs takes seconds and they have never won on
2 cores. The headline (last line) is end-to-end samples/s, read included; serve-only rates are
printed too. Run from the repo root:

    .venv/bin/python benchmarks/data_loader.py [--rows 1000000] [--samples 0 (= one epoch)]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Dataset

if __package__ in (None, ""):  # run as a file: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.data.datasets import BatchStream, TabularDataset

SEED = 0


def write_parquet(path: Path, *, rows: int, features: int, classes: int) -> None:
    """Writes `rows` x `features` float32 columns and an int64 `label` column."""
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((rows, features), dtype=np.float32)
    columns: dict[str, np.ndarray] = {f"f{j}": x[:, j] for j in range(features)}
    columns["label"] = rng.integers(0, classes, rows)
    pq.write_table(pa.table(columns), path, row_group_size=128 * 1024)


class RowDataset(Dataset):
    """The usual per-row Dataset: arrays in memory, one sample per __getitem__."""

    def __init__(self, path: Path) -> None:
        table = pq.read_table(path)
        names = [n for n in table.column_names if n != "label"]
        self.x = torch.from_numpy(np.column_stack([table.column(n).to_numpy() for n in names]))
        self.y = torch.from_numpy(table.column("label").to_numpy().copy())

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def run_ours(path: Path, samples: int, batch_size: int) -> tuple[float, float]:
    """Returns (read seconds, serve seconds) for TabularDataset + BatchStream."""
    t0 = time.perf_counter()
    ds = TabularDataset.from_parquet(str(path), target="label", task="classification")
    t1 = time.perf_counter()
    stream = BatchStream(ds, global_batch_size=batch_size, rank=0, world_size=1, seed=SEED)
    for _, x, y in itertools.islice(stream, min(samples // batch_size, stream.steps_per_epoch)):
        assert x.shape[0] == y.shape[0] == batch_size
    return t1 - t0, time.perf_counter() - t1


def run_dataloader(path: Path, samples: int, batch_size: int, workers: int) -> tuple[float, float]:
    """Returns (read seconds, serve seconds) for a shuffled DataLoader over RowDataset."""
    t0 = time.perf_counter()
    ds = RowDataset(path)
    t1 = time.perf_counter()
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        drop_last=True,
        generator=torch.Generator().manual_seed(SEED),
    )
    for x, y in itertools.islice(loader, samples // batch_size):
        assert x.shape[0] == y.shape[0] == batch_size
    return t1 - t0, time.perf_counter() - t1


def main(argv: list[str] | None = None) -> None:
    """Runs the benchmark and prints a table, then the speedup as the last line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the Parquet file")
    parser.add_argument("--features", type=int, default=32, help="float32 feature columns")
    parser.add_argument(
        "--samples", type=int, default=0, help="samples served per run; 0: one full epoch"
    )
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (median)")
    parser.add_argument(
        "--worker-repeats", type=int, default=2, help="repeats for DataLoader num_workers > 0"
    )
    parser.add_argument("--workers", default="0,1,2", help="DataLoader num_workers to try")
    args = parser.parse_args(argv)
    wanted = args.samples if args.samples > 0 else args.rows
    samples = min(wanted, args.rows) // args.batch_size * args.batch_size
    if samples == 0:
        parser.error(f"--rows {args.rows} is smaller than one batch of {args.batch_size}")

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.parquet"
        write_parquet(path, rows=args.rows, features=args.features, classes=10)
        contenders: dict[str, tuple[int, Callable[[], tuple[float, float]]]] = {
            "trainer.data (index_select)": (
                args.repeats,
                lambda: run_ours(path, samples, args.batch_size),
            )
        }
        for w in (int(s) for s in args.workers.split(",")):
            contenders[f"DataLoader per-row, workers={w}"] = (
                args.repeats if w == 0 else min(args.repeats, args.worker_repeats),
                functools.partial(run_dataloader, path, samples, args.batch_size, w),
            )
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
        run_ours(path, min(samples, 10 * args.batch_size), args.batch_size)  # warm the page cache
        for i in range(args.repeats):
            for name, (repeats, fn) in contenders.items():
                if i < repeats:
                    results[name].append(fn())

    scope = "one epoch" if samples == args.rows // args.batch_size * args.batch_size else "part"
    print(
        f"{args.rows} rows x {args.features} float32, {samples} samples served per run "
        f"({scope}), "
        f"batch {args.batch_size}, shuffle, medians of interleaved repeats"
    )
    print(
        f"{'pipeline':34s} {'runs':>4s} {'read s':>8s} {'serve s':>8s} {'total/s':>12s} "
        f"{'serve/s':>12s}"
    )
    rates: dict[str, tuple[float, float]] = {}
    for name, runs in results.items():
        read = statistics.median(r for r, _ in runs)
        serve = statistics.median(s for _, s in runs)
        total_rate = statistics.median(samples / (r + s) for r, s in runs)
        serve_rate = statistics.median(samples / s for _, s in runs)
        rates[name] = (total_rate, serve_rate)
        print(
            f"{name:34s} {len(runs):4d} {read:8.3f} {serve:8.3f} {total_rate:12,.0f} "
            f"{serve_rate:12,.0f}"
        )
    ours_name = next(iter(rates))
    best = max((n for n in rates if n != ours_name), key=lambda n: rates[n][0])
    print(f"baseline = {best}")
    best_serve = max(rates[n][1] for n in rates if n != ours_name)
    print(f"serve-only speedup (reads excluded): {rates[ours_name][1] / best_serve:.1f}x")
    print(f"data_loader speedup: {rates[ours_name][0] / rates[best][0]:.1f}x (goal >= 10x)")


if __name__ == "__main__":
    main()
