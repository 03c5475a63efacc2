"""Benchmark: trainer.steps.preprocess against a straightforward pandas version of the same work.

Both contenders read the same demo Parquet file (``make_demo_table``: 6 numeric columns, some
with gaps, 3 text columns, a yes/no target), split the rows with the same seeded, stratified
indices (``split_indices``: the split is not what is compared), impute numeric gaps with the
training median and add ``<col>__missing`` flags, one-hot encode text columns with the training
categories (missing -> ``__missing__``, the rest -> ``__other__``), standardise with training
mean and std, and write ``train/val/test.parquet``. Ours also validates every column and writes
``schema.json`` and ``stats.json``; the baseline does not.

- **ours**: ``trainer.steps.preprocess.preprocess`` (pyarrow + numpy, column-wise).
- **pandas**: ``pd.read_parquet``, ``fillna``, ``pd.get_dummies``, arithmetic on Series,
  ``DataFrame.to_parquet``, as one would write it by hand.

Each run is a fresh subprocess (so peak memory is that run's alone), repeats interleave the two,
and medians are reported. Time is the work inside the process (imports excluded); memory is the
peak resident set above the resident set after imports (``VmHWM - VmRSS``), so pandas is not
charged for importing itself. The outputs are compared (same feature names, ``allclose``
features, equal labels); a mismatch exits with status 1. Run from the repo root:

    .venv/bin/python benchmarks/preprocess.py [--rows 1000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

if __package__ in (None, ""):  # run as a file: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.steps.preprocess.tabular import MISSING, OTHER, split_indices

TARGET = "churned"
SEED = 0
SPLITS = ("train", "val", "test")


def _status_kb(field: str) -> int:
    """A ``VmRSS``/``VmHWM`` figure of this process, in kB, from /proc."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def run_ours(data: str, out: str) -> None:
    """The real step."""
    from trainer.steps.preprocess import PreprocessConfig, preprocess

    preprocess(PreprocessConfig(target=TARGET, seed=SEED), data_uri=data, output_uri=out)


def run_pandas(data: str, out: str) -> None:
    """The same work, written the way one would with pandas."""
    import pandas as pd

    df = pd.read_parquet(data)
    labels = df.pop(TARGET)
    classes = sorted(labels.unique())
    y = pd.Categorical(labels, categories=classes).codes.astype(np.int64)
    train_idx, val_idx, test_idx = split_indices(
        len(df), classes=y, val_fraction=0.15, test_fraction=0.15, seed=SEED
    )
    df = df.iloc[np.concatenate([train_idx, val_idx, test_idx])].reset_index(drop=True)
    y = y[np.concatenate([train_idx, val_idx, test_idx])]
    n_train = len(train_idx)
    train = df.iloc[:n_train]
    parts = []
    for col in df.columns:
        if pd.api.types.is_numeric_dtype(df[col]):
            missing = df[col].isna()
            filled = df[col].fillna(train[col].median()).astype("float64")
            mean = filled.iloc[:n_train].mean()
            std = filled.iloc[:n_train].std(ddof=0) or 1.0
            parts.append(((filled - mean) / std).rename(col))
            if missing.iloc[:n_train].any():
                parts.append(missing.astype("float32").rename(f"{col}__missing"))
        else:
            values = df[col].fillna(MISSING)
            counts = values.iloc[:n_train].value_counts()
            top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:50]
            kept = sorted(v for v, _ in top if v != MISSING)
            kept += [MISSING] if any(v == MISSING for v, _ in top) else []
            values = values.where(values.isin(kept), OTHER)
            categories = pd.Categorical(values, categories=[*kept, OTHER])
            parts.append(pd.get_dummies(categories, prefix=col, prefix_sep="=", dtype="float32"))
    features = pd.concat(parts, axis=1).astype("float32")
    features[TARGET] = y
    bounds = np.cumsum([0, len(train_idx), len(val_idx), len(test_idx)])
    Path(out).mkdir(parents=True, exist_ok=True)
    for name, lo, hi in zip(SPLITS, bounds[:-1], bounds[1:], strict=True):
        features.iloc[lo:hi].to_parquet(f"{out}/{name}.parquet", index=False)


CONTENDERS = {"ours": run_ours, "pandas": run_pandas}


def child(name: str, data: str, out: str) -> None:
    """Run one contender in this (fresh) process; print seconds and peak memory as JSON."""
    if name == "pandas":
        import pandas  # noqa: F401  (imported before the baseline RSS, as the step's own imports)
    else:
        import trainer.steps.preprocess  # noqa: F401
    rss0 = _status_kb("VmRSS")
    t0 = time.perf_counter()
    CONTENDERS[name](data, out)
    seconds = time.perf_counter() - t0
    peak = _status_kb("VmHWM")
    print(json.dumps({"seconds": seconds, "peak_mb": peak / 1024, "work_mb": (peak - rss0) / 1024}))


def spawn(name: str, data: Path, out: Path) -> dict[str, float]:
    """One measured run of ``name`` in a fresh interpreter."""
    cmd = [sys.executable, __file__, "--child", name, "--data", str(data), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(ours: Path, theirs: Path) -> None:
    """Exit 1 unless both produced the same features and labels for every split."""
    for split in SPLITS:
        a = pq.read_table(ours / f"{split}.parquet")
        b = pq.read_table(theirs / f"{split}.parquet")
        if a.column_names != b.column_names:
            raise SystemExit(f"{split}: columns differ:\n{a.column_names}\n{b.column_names}")
        for name in a.column_names:
            x, z = a.column(name).to_numpy(), b.column(name).to_numpy()
            if not np.allclose(x, z, rtol=1e-5, atol=1e-5):
                raise SystemExit(f"{split}: column {name!r} differs")


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; print a table, the memory ratio, then the time ratio last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the demo table")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (median)")
    parser.add_argument("--child", choices=sorted(CONTENDERS), help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.data, args.out)
        return

    from trainer.steps.preprocess import write_demo_data

    results: dict[str, list[dict[str, float]]] = {name: [] for name in CONTENDERS}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "demo.parquet"
        write_demo_data(str(data), rows=args.rows, task="classification", seed=SEED)
        for i in range(args.repeats):
            for name in CONTENDERS:
                results[name].append(spawn(name, data, Path(tmp) / f"{name}-{i}"))
        compare(Path(tmp) / "ours-0", Path(tmp) / "pandas-0")

    med = {
        name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for name, runs in results.items()
    }
    print(
        f"{args.rows} rows (demo table, 9 columns -> 31 features), "
        f"median of {args.repeats} interleaved runs, each in a fresh process; outputs match"
    )
    print(f"{'contender':10s} {'work s':>8s} {'rows/s':>12s} {'work MB':>9s} {'peak RSS MB':>12s}")
    for name, m in med.items():
        print(
            f"{name:10s} {m['seconds']:8.2f} {args.rows / m['seconds']:12,.0f} "
            f"{m['work_mb']:9.0f} {m['peak_mb']:12.0f}"
        )
    memory = med["ours"]["work_mb"] / med["pandas"]["work_mb"]
    speed = med["ours"]["seconds"] / med["pandas"]["seconds"]
    print(f"preprocess memory ratio: {memory:.2f} (goal <= 1.0)")
    print(f"preprocess time ratio: {speed:.2f} (goal <= 0.6)")


if __name__ == "__main__":
    main()
