"""Benchmark: preprocess at scale, in a memory budget, against DuckDB doing the same work.

The table has 12 columns (7 numeric, three of them with gaps; 4 text columns of 3 to 300
distinct values; a yes/no target) at 1M, 4M and 16M rows, one Parquet file of 128Ki-row row
groups. The work: a seeded, stratified split (15% validation, 15% test), the training split's
medians imputing numeric gaps (plus ``<col>__missing`` flags), the training split's 50 most
frequent categories one-hot encoded (the rest ``__other__``), standardisation with the training
mean and std, and ``train/val/test.parquet`` written.

- **ours**: :func:`trainer.steps.preprocess.stream.preprocess_streaming` with
  ``memory_budget`` = ``--budget`` (record batches, exact medians; also validates and types
  every column and writes ``schema.json`` and ``stats.json``).
- **duckdb**: the same work in DuckDB SQL (its own out-of-core engine; ``memory_limit`` =
  ``--budget``, ``threads`` = the machine's cores, spilling to a temporary folder): the split
  by ``row_number()`` per class over a seeded hash order, ``median``/``avg``/``stddev_pop`` on
  the training rows, one-hot by ``CASE``, three ``COPY ... TO`` Parquet.
- **in-memory**: today's whole-table path (:func:`trainer.steps.preprocess.preprocess` with a
  budget it fits in), at the sizes up to ``--in-memory-max`` rows.

Each run is a fresh subprocess; time is the work inside it (imports excluded) and memory its
peak resident set (``VmHWM``). The split rows differ between ours and DuckDB (different shuffles),
so their outputs are compared by shape (rows per split, feature count); ours and the in-memory
path are compared row for row. The last line is ours/DuckDB time at the largest size. Run from
the repo root:

    .venv/bin/python benchmarks/preprocess_scale.py [--sizes 1000000,4000000,16000000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

if __package__ in (None, ""):  # run as a file: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET = "churned"
SEED = 0
SPLITS = ("train", "val", "test")
NUMERIC = ("age", "income", "tenure", "charges", "calls", "last_login", "score")
GAPPY = ("income", "last_login", "score")
TEXT = {"plan": 3, "region": 8, "device": 12, "city": 300}
MAX_CATEGORIES = 50
CHUNK = 1 << 20


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def write_table(path: Path, rows: int) -> int:
    """Write the benchmark table a million rows at a time; returns its in-memory bytes."""
    rng = np.random.default_rng(SEED)
    names = {k: np.array([f"{k}_{i:03d}" for i in range(n)]) for k, n in TEXT.items()}
    nbytes = 0
    writer: pq.ParquetWriter | None = None
    for lo in range(0, rows, CHUNK):
        n = min(CHUNK, rows - lo)
        cols: dict[str, pa.Array] = {}
        for i, name in enumerate(NUMERIC):
            x = rng.normal(50 * (i + 1), 10 * (i + 1), n)
            if name in ("age", "tenure", "calls"):
                cols[name] = pa.array(np.abs(x).astype(np.int64))
                continue
            mask = rng.random(n) < 0.05 if name in GAPPY else None
            cols[name] = pa.array(x, mask=mask)
        for name, k in TEXT.items():
            # Zipf-like frequencies: a few common values, a long tail.
            p = 1.0 / np.arange(1, k + 1)
            idx = rng.choice(k, n, p=p / p.sum())
            mask = rng.random(n) < 0.02 if name == "device" else None
            cols[name] = pa.array(names[name][idx], mask=mask)
        churn = rng.random(n) < 0.2 + 0.002 * (cols["calls"].to_numpy() % 50)
        cols[TARGET] = pa.array(np.where(churn, "yes", "no"))
        table = pa.table(cols)
        nbytes += table.nbytes
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema)
        writer.write_table(table, row_group_size=128 * 1024)
    assert writer is not None
    writer.close()
    return nbytes


def run_ours(data: str, out: str, budget: int) -> None:
    from trainer.steps.preprocess import PreprocessConfig
    from trainer.steps.preprocess.stream import preprocess_streaming

    cfg = PreprocessConfig(target=TARGET, seed=SEED, memory_budget=budget)
    preprocess_streaming(cfg, data_uri=data, output_uri=out, fingerprint="", budget=budget)


def run_in_memory(data: str, out: str, budget: int) -> None:
    from trainer.steps.preprocess import PreprocessConfig, preprocess

    preprocess(PreprocessConfig(target=TARGET, seed=SEED, memory_budget=1 << 40), data_uri=data,
               output_uri=out)  # fmt: skip


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lit(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def run_duckdb(data: str, out: str, budget: int) -> None:
    import os

    import duckdb

    con = duckdb.connect()
    con.execute(f"SET memory_limit='{budget // (1 << 20)}MB'")
    con.execute(f"SET threads={os.cpu_count() or 1}")
    con.execute(f"SET temp_directory={_lit(out + '.spill')}")
    con.execute("SET preserve_insertion_order=false")
    src = f"read_parquet({_lit(data)})"
    # Seeded stratified split: per class, the first 15% of rows in a seeded hash order are
    # test, the next 15% validation (round half up, as ours).
    con.execute(
        f"""CREATE TEMP TABLE split AS
        WITH s AS (SELECT *, row_number() OVER () AS rid FROM {src}),
        r AS (SELECT *, row_number() OVER (PARTITION BY {_q(TARGET)} ORDER BY hash(rid + {SEED}))
                          AS rk,
                        count(*) OVER (PARTITION BY {_q(TARGET)}) AS cnt FROM s)
        SELECT * EXCLUDE (rk, cnt),
          CASE WHEN rk <= floor(cnt * 0.15 + 0.5) THEN 2
               WHEN rk <= 2 * floor(cnt * 0.15 + 0.5) THEN 1 ELSE 0 END AS split
        FROM r"""
    )
    # Exact medians, a column at a time: DuckDB's median holds a column's values in memory, and
    # all seven at once ran out of a 512 MB limit at 16M rows.
    med = {}
    for c in NUMERIC:
        row = con.execute(f"SELECT median({_q(c)}) FROM split WHERE split = 0").fetchone()
        assert row is not None
        med[c] = row[0]
    mom_sql = ", ".join(
        f"avg(coalesce({_q(c)}, {med[c]})), stddev_pop(coalesce({_q(c)}, {med[c]})), "
        f"count(*) - count({_q(c)})"
        for c in NUMERIC
    )
    moms = con.execute(f"SELECT {mom_sql} FROM split WHERE split = 0").fetchone()
    assert moms is not None
    exprs = []
    for i, c in enumerate(NUMERIC):
        mean, std, missing = moms[3 * i : 3 * i + 3]
        std = std or 1.0
        exprs.append(f"((coalesce({_q(c)}, {med[c]}) - {mean}) / {std})::FLOAT AS {_q(c)}")
        if missing:
            exprs.append(f"({_q(c)} IS NULL)::FLOAT AS {_q(c + '__missing')}")
    for c in TEXT:
        top = con.execute(
            f"""SELECT coalesce({_q(c)}, '__missing__') AS v, count(*) AS n FROM split
            WHERE split = 0 GROUP BY v ORDER BY n DESC, v LIMIT {MAX_CATEGORIES}"""
        ).fetchall()
        kept = sorted(v for v, _ in top)
        value = f"coalesce({_q(c)}, '__missing__')"
        for v in kept:
            exprs.append(f"({value} = {_lit(v)})::FLOAT AS {_q(f'{c}={v}')}")
        inlist = ", ".join(_lit(v) for v in kept)
        exprs.append(f"({value} NOT IN ({inlist}))::FLOAT AS {_q(f'{c}=__other__')}")
    exprs.append(f"({_q(TARGET)} = 'yes')::BIGINT AS {_q(TARGET)}")
    Path(out).mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(SPLITS):
        con.execute(
            f"COPY (SELECT {', '.join(exprs)} FROM split WHERE split = {i}) "
            f"TO {_lit(f'{out}/{name}.parquet')} (FORMAT parquet, COMPRESSION snappy)"
        )
    con.close()


CONTENDERS = {"ours": run_ours, "duckdb": run_duckdb, "in-memory": run_in_memory}


def child(name: str, data: str, out: str, budget: int) -> None:
    """Run one contender in this fresh process; print seconds and peak memory as JSON."""
    if name == "duckdb":
        import duckdb  # noqa: F401
    else:
        import trainer.steps.preprocess.stream  # noqa: F401
    t0 = time.perf_counter()
    CONTENDERS[name](data, out, budget)
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "peak_mb": _status_kb("VmHWM") / 1024}))


def spawn(name: str, data: Path, out: Path, budget: int) -> dict[str, Any]:
    """One run of ``name`` in a fresh interpreter: its seconds and peak, or why it failed."""
    cmd = [sys.executable, __file__, "--child", name, "--data", str(data), "--out", str(out),
           "--budget", str(budget)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return {"failed": 1.0, "why": last[:160]}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def shape(out: Path) -> tuple[list[int], int]:
    """Rows per split and feature count of an output folder."""
    rows = [pq.ParquetFile(out / f"{s}.parquet").metadata.num_rows for s in SPLITS]
    return rows, len(pq.ParquetFile(out / "train.parquet").schema_arrow.names) - 1


def same_rows(a: Path, b: Path) -> bool:
    """Whether two outputs hold the same rows (labels equal, features allclose), per split."""
    for split in SPLITS:
        pa_, pb = pq.ParquetFile(a / f"{split}.parquet"), pq.ParquetFile(b / f"{split}.parquet")
        if pa_.schema_arrow != pb.schema_arrow or pa_.metadata.num_rows != pb.metadata.num_rows:
            return False
        ia, ib = pa_.iter_batches(1 << 16), pb.iter_batches(1 << 16)
        for x, y in zip(ia, ib, strict=False):
            for col in x.schema.names:
                if not np.allclose(x[col].to_numpy(), y[col].to_numpy(), rtol=1e-5, atol=1e-5):
                    return False
    return True


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a table, then ours/DuckDB time at the largest size last."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="1000000,4000000,16000000", help="rows, commas")
    parser.add_argument("--budget", type=int, default=512 << 20, help="memory budget, bytes")
    parser.add_argument("--in-memory-max", type=int, default=4_000_000,
                        help="largest table the in-memory path runs on")  # fmt: skip
    parser.add_argument("--child", choices=sorted(CONTENDERS), help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.data, args.out, args.budget)
        return 0

    sizes = [int(s) for s in args.sizes.split(",")]
    budget_mb = args.budget / (1 << 20)
    print(f"12 columns (7 numeric, 4 text, target), budget {budget_mb:.0f} MB for ours and DuckDB")
    print(
        f"{'rows':>10s} {'table MB':>9s} {'contender':10s} {'s':>8s} {'rows/s':>11s} "
        f"{'peak MB':>8s}"
    )
    ratio, at = float("nan"), 0
    for rows in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "table.parquet"
            table_mb = write_table(data, rows) / (1 << 20)
            names = ["ours", "duckdb"] + (["in-memory"] if rows <= args.in_memory_max else [])
            results: dict[str, dict[str, Any]] = {}
            for name in names:
                results[name] = spawn(name, data, Path(tmp) / name, args.budget)
                r = results[name]
                if "failed" in r:
                    print(f"{rows:10d} {table_mb:9.0f} {name:10s} FAILED: {r['why']}", flush=True)
                    continue
                print(
                    f"{rows:10d} {table_mb:9.0f} {name:10s} {r['seconds']:8.2f} "
                    f"{rows / r['seconds']:11,.0f} {r['peak_mb']:8.0f}",
                    flush=True,
                )
            if "failed" in results["ours"]:
                print("OURS FAILED")
                return 1
            if "failed" in results["duckdb"]:
                continue  # no ratio at this size
            ours, theirs = shape(Path(tmp) / "ours"), shape(Path(tmp) / "duckdb")
            if sum(ours[0]) != rows or sum(theirs[0]) != rows or ours[1] != theirs[1]:
                print(f"OUTPUTS DIFFER IN SHAPE: ours {ours}, duckdb {theirs}")
                return 1
            if "seconds" in results.get("in-memory", {}) and not same_rows(
                Path(tmp) / "ours", Path(tmp) / "in-memory"
            ):
                print("OURS AND THE IN-MEMORY PATH DIFFER")
                return 1
            ratio, at = results["ours"]["seconds"] / results["duckdb"]["seconds"], rows
    print(f"preprocess_scale ratio: {ratio:.2f} (ours/DuckDB time at {at} rows; goal <= 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
