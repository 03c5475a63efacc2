"""A learnable synthetic tabular dataset and worker config, for ``make run`` and tests.

``python -m trainer.demo --out DIR`` writes ``train.parquet``, ``val.parquet`` and a worker
``config.json`` under DIR; ``--summarize DIR`` prints what the trained model reports.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainer.base import storage
from trainer.base.typedconfig import from_dict, to_json
from trainer.config import WorkerConfig


def make_table(
    rows: int, *, features: int = 8, classes: int = 3, seed: int = 0, task: str = "classification"
) -> pa.Table:
    """Gaussian features and a target that depends non-linearly on them (plus noise)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, features)).astype(np.float32)
    w = rng.standard_normal((features, max(classes, 1))).astype(np.float32)
    score = (
        np.tanh(x @ w)
        + 0.3 * (x[:, :1] * x[:, 1:2])
        + 0.1 * rng.standard_normal((rows, max(classes, 1))).astype(np.float32)
    )
    cols = {f"f{i}": x[:, i] for i in range(features)}
    if task == "classification":
        cols["label"] = score.argmax(axis=1).astype(np.int64)
    else:
        cols["label"] = score.sum(axis=1).astype(np.float32)
    return pa.table(cols)


def write_demo(out: str, *, rows: int = 20_000, seed: int = 0, nproc_hint: int = 2) -> str:
    """Write the demo dataset and a worker config under ``out``; return the config URI."""
    table = make_table(rows + rows // 5, seed=seed)
    train, val = table.slice(0, rows), table.slice(rows)
    for name, part in (("train.parquet", train), ("val.parquet", val)):
        with storage.open_output(storage.join(out, name)) as f:
            pq.write_table(part, f, row_group_size=8192)
    cfg = from_dict(
        WorkerConfig,
        {
            "data": {
                "train_uri": storage.join(out, "train.parquet"),
                "val_uri": storage.join(out, "val.parquet"),
                "target": "label",
            },
            "model": {"name": "mlp", "hidden_dim": 64, "num_layers": 2},
            "optim": {"lr": 3e-3, "warmup_steps": 20},
            "train": {
                "epochs": 3,
                "global_batch_size": 128 * nproc_hint,
                "log_every_steps": 50,
                "early_stopping": {"metric": "val_loss", "patience": 2},
            },
            "checkpoint": {"uri": storage.join(out, "checkpoints"), "every_steps": 100},
            "output": {
                "model_uri": storage.join(out, "model"),
                "history_uri": storage.join(out, "history.jsonl"),
            },
        },
    )
    uri = storage.join(out, "config.json")
    storage.write_text(uri, to_json(cfg))
    return uri


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.demo", description=__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", help="folder (any URI) to write the dataset and config to")
    group.add_argument("--summarize", metavar="DIR", help="print the trained model's summary")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.out:
        uri = write_demo(args.out, rows=args.rows, seed=args.seed)
        print(f"demo dataset and config written: {uri}")
        return 0
    model = storage.join(args.summarize, "model")
    meta = storage.read_json(storage.join(model, "model.json"))
    metrics = storage.read_json(storage.join(model, "metrics.json"))
    print(
        f"model: {model}  ({meta['model']['name']}, {len(meta['features'])} features, "
        f"trainer {meta['trainer_version']})"
    )
    print("metrics: " + json.dumps(metrics, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
