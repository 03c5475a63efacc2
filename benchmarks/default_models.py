"""Benchmark: the default training path against scikit-learn baselines on standard tables.

**Question:** with no settings at all, how close does the pipeline's model come to a one-line
scikit-learn model on real tables, from 150 to 20,000 rows? **Goal:** on every table the model's
test metric is within 1% of the best baseline (ratio >= 0.99) and never below the trivial
predictor.

Each table (real public data shipped inside the scikit-learn, statsmodels and vega_datasets
wheels, benchmark-only dev dependencies: no downloads) goes through the real steps:
``preprocess`` (default config: split 70/15/15, impute, standardise, one-hot), the train
step's settings (``step_settings`` at the pipeline's defaults, then ``plan_worker_config``: settings
from the data and the target scale), the training loop (``trainer.training.loop.train``, in this
process, one CPU process) and ``evaluate`` (which fits the baselines on the training split and
scores them on the same test rows).

Ratio per table, oriented so that 1.0 means "as good as the best baseline" and above is better:
accuracy / best accuracy (classification; and best log loss / log loss), best RMSE / RMSE
(regression), on the means over the splits of a table (each seed splits the rows and seeds the
training differently). A small table gets as many splits as it takes to score
:data:`MIN_TEST_ROWS` test rows in all (iris 63, wine 56, breast_cancer 18, diabetes 23, ...): a
150-row table's 24-row test split moves accuracy by 4% a row, so a single split would decide a
1% goal by luck. ``--seeds`` sets the fewest splits of every table. The headline is the worst
ratio over the tables (accuracy or log loss, whichever is worse); the line above it counts runs
whose model scored below the trivial predictor, the tables below the goal and the mean ratio.
The ``old`` contender is the model before issue 28 (:data:`OLD_DEFAULT`: no periodic embedding,
no ensemble, learning rate 0.001, 1000 steps, no temperature), trained on the same splits in the
same run (``--no-old`` skips it). The last block is the Markdown table of
``benchmarks/README.md``.

Run from the repo root: ``.venv/bin/python benchmarks/default_models.py [--seeds 3]
[--min-test-rows 500] [--tables iris,wine] [--set model.linear=none]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

if __package__ in (None, ""):  # run as a file: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.params import train_settings
from trainer.base.typedconfig import from_dict
from trainer.distributed import dist
from trainer.steps.evaluate import EvaluateConfig, evaluate
from trainer.steps.preprocess import PreprocessConfig, preprocess
from trainer.steps.train import TrainStepConfig, plan_worker_config
from trainer.training import loop

OLD_DEFAULT: dict[str, Any] = {
    "model.embedding": "none",
    "model.ensemble": 1,
    "optim.lr": 0.001,
    "auto.min_steps": 1000,
    "train.calibrate": False,
}
"""Settings that restore the model before issue 28 (the ``old`` column, trained in the same run
on the same splits); ``--set`` values apply to both."""
GOAL = 0.99
"""The model's metric must be within 1% of the best baseline's."""
MIN_TEST_ROWS = 1500
"""Score each table over at least this many test rows (summed over splits): one row of iris's
24-row test split is 4% of accuracy, which decides a 1% goal by the luck of one split. At 500
rows the standard error of an 80% accuracy is still 1.8%, more than the goal's 1% margin (two
tables fell below 0.99 there that pass at 1500, see ``benchmarks/README.md``); at 1500 it is
1.0%."""


def _sk(loader: str) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        from sklearn import datasets

        x, y = getattr(datasets, loader)(return_X_y=True)
        frame = pd.DataFrame(np.asarray(x, dtype=np.float64))
        frame.columns = [f"f{i}" for i in range(frame.shape[1])]
        return frame.assign(y=np.asarray(y))

    return load


def _sm(
    name: str, target: str, drop: tuple[str, ...] = (), text: tuple[str, ...] = ()
) -> Callable[[], pd.DataFrame]:
    """A statsmodels table (shipped as CSV in its wheel); ``text`` columns become categories."""

    def load() -> pd.DataFrame:
        import warnings

        import statsmodels.datasets as smd

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            frame = getattr(smd, name).load_pandas().data
        frame = frame.drop(columns=list(drop)).rename(columns={target: "y"})
        for col in text:
            frame[col] = frame[col].astype(str)
        return frame

    return load


def _vega(name: str, target: str, drop: tuple[str, ...] = ()) -> Callable[[], pd.DataFrame]:
    """A vega_datasets table (shipped as CSV in its wheel); rows without a target dropped."""

    def load() -> pd.DataFrame:
        from vega_datasets import local_data

        frame = getattr(local_data, name)().drop(columns=list(drop)).rename(columns={target: "y"})
        return frame[frame["y"].notna()].reset_index(drop=True)

    return load


TABLES: dict[str, tuple[str, Callable[[], pd.DataFrame]]] = {
    "iris": ("classification", _sk("load_iris")),
    "wine": ("classification", _sk("load_wine")),
    "breast_cancer": ("classification", _sk("load_breast_cancer")),
    "digits": ("classification", _sk("load_digits")),
    "diabetes": ("regression", _sk("load_diabetes")),
    # 20,190 people of the RAND health insurance experiment: doctor visits, a skewed count.
    "randhie": ("regression", _sm("randhie", "mdvis")),
    # 840 rows: 210 travellers x 4 modes (a categorical column), which mode was chosen.
    "modechoice": ("classification", _sm("modechoice", "choice", ("individual",), ("mode",))),
    # 6,366 women: time in extramarital affairs, mostly zero (skewed).
    "fair": ("regression", _sm("fair", "affairs", (), ("occupation", "occupation_husb"))),
    # 944 voters of the 1996 US election: Clinton or Dole.
    "anes96": ("classification", _sm("anes96", "vote")),
    # 220 rows: investment of 11 US firms over 20 years (firm: a categorical column).
    "grunfeld": ("regression", _sm("grunfeld", "invest")),
    # 1,461 days of Seattle weather (a date column): which of 5 weathers.
    "seattle_weather": ("classification", _vega("seattle_weather", "weather")),
    # 398 cars: fuel use from engine, weight, origin (categorical), model year (a date).
    "cars": ("regression", _vega("cars", "Miles_per_Gallon", ("Name",))),
    # 8,759 hours of San Francisco temperature: hour x season, an interaction trees find.
    "sf_temps": ("regression", _vega("sf_temps", "temp")),
}
"""Name -> (task, loader of the table with its target as ``y``): real public tables shipped
inside scikit-learn, statsmodels and vega_datasets wheels (no downloads)."""


def write_table(path: Path, frame: pd.DataFrame, task: str) -> None:
    """The table as Parquet (class labels as integers or text, as they come)."""
    if task == "regression":
        frame = frame.assign(y=frame["y"].astype(np.float64))
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)


def _hgb_seconds(ds: str, task: str, seed: int) -> float:
    """Seconds the hgb baseline takes to fit on the training split (as evaluate fits it)."""
    from trainer.steps.evaluate.baselines import _estimator

    train = pq.read_table(Path(ds) / "train.parquet").to_pandas()
    x, y = train.drop(columns=["y"]).to_numpy(), train["y"].to_numpy()
    started = time.perf_counter()
    _estimator("hgb", task, seed).fit(x, y)
    return time.perf_counter() - started


def _train(
    ds: str, root: Path, ctx: dist.DistContext, overrides: dict[str, Any], seed: int
) -> tuple[Any, Any, float]:
    """Train one model on the preprocessed ``ds`` into ``root``; (loop result, settings, s)."""
    step = from_dict(TrainStepConfig, train_settings({"seed": seed, "hyperparams_json": overrides}))
    worker, auto = plan_worker_config(
        step, dataset_uri=ds, model_uri=str(root / "model"), work_uri=str(root / "work")
    )
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the trainer's JSON log lines
        trained = loop.train(worker, ctx)
    return trained, auto, time.perf_counter() - started


def run_once(
    name: str,
    root: Path,
    ctx: dist.DistContext,
    overrides: dict[str, Any],
    seed: int,
    old: bool = True,
) -> dict[str, Any]:
    """Preprocess (split ``seed``), train with the defaults (and with :data:`OLD_DEFAULT` when
    ``old``), evaluate with the baselines."""
    task, load = TABLES[name]
    frame = load()
    root.mkdir(parents=True)
    write_table(root / "data.parquet", frame, task)
    ds = str(root / "dataset")
    split = preprocess(PreprocessConfig(target="y", task=task, seed=seed),
                       data_uri=str(root / "data.parquet"), output_uri=ds)  # fmt: skip
    trained, auto, seconds = _train(ds, root, ctx, overrides, seed)
    result = evaluate(
        EvaluateConfig(), model_uri=str(root / "model"), dataset_uri=ds,
        report_uri=str(root / "report.html"),
    )  # fmt: skip
    metrics = {"model": result.metrics, **result.baselines}
    old_s = math.nan
    if old:
        _, _, old_s = _train(ds, root / "old", ctx, {**OLD_DEFAULT, **overrides}, seed)
        metrics["old"] = evaluate(
            EvaluateConfig(baselines=False), model_uri=str(root / "old" / "model"), dataset_uri=ds,
            report_uri=str(root / "old" / "report.html"),
        ).metrics  # fmt: skip
    return {
        "rows": len(frame),
        "hgb_s": _hgb_seconds(ds, task, seed),
        "test_rows": split.test_rows,
        "task": task,
        "metrics": metrics,
        "steps": trained.steps,
        "train_s": seconds,
        "old_s": old_s,
        "settings": auto.chosen if auto else {},
    }


def run_table(
    name: str,
    work: Path,
    ctx: dist.DistContext,
    overrides: dict[str, Any],
    seeds: int,
    min_test_rows: int = 0,
    old: bool = True,
) -> dict[str, Any]:
    """At least ``seeds`` splits of one table, and enough of them to score ``min_test_rows``
    test rows in all; scores are means over the splits."""
    runs = [run_once(name, work / f"{name}-0", ctx, overrides, 0, old)]
    splits = max(seeds, math.ceil(min_test_rows / max(runs[0]["test_rows"], 1)))
    runs += [run_once(name, work / f"{name}-{s}", ctx, overrides, s, old) for s in range(1, splits)]
    seeds = len(runs)
    task = runs[0]["task"]
    metric, extra = ("accuracy", "log_loss") if task == "classification" else ("rmse", "r2")
    higher = task == "classification"

    def mean(who: str, key: str) -> float:
        return statistics.fmean(r["metrics"][who].get(key, math.nan) for r in runs)

    contenders = list(runs[0]["metrics"])
    scores = {who: mean(who, metric) for who in contenders}
    extras = {who: mean(who, extra) for who in contenders}
    baselines = [who for who in contenders if who not in ("model", "old")]
    best_name = (max if higher else min)(baselines, key=lambda b: scores[b])
    best = scores[best_name]

    def ratio_of(who: str) -> float:
        value = scores.get(who)
        if not value or not best:
            return math.nan if value is None else 0.0
        return value / best if higher else best / value

    log_loss_best = min((extras[b] for b in baselines), default=math.nan) if higher else math.nan
    log_loss_ratio = {
        who: log_loss_best / extras[who] if higher and extras.get(who) else math.nan
        for who in ("model", "old")
    }
    trivial = scores.get("trivial")
    below = sum(
        (r["metrics"]["model"][metric] < r["metrics"]["trivial"][metric])
        if higher
        else (r["metrics"]["model"][metric] > r["metrics"]["trivial"][metric])
        for r in runs
        if "trivial" in r["metrics"]
    )
    return {
        "name": name,
        "rows": runs[0]["rows"],
        "test_rows": sum(r["test_rows"] for r in runs),
        "task": task,
        "metric": metric,
        "extra": extra,
        "seeds": seeds,
        "scores": scores,
        "extras": extras,
        "best": best_name,
        "ratio": ratio_of("model"),
        "old_ratio": ratio_of("old"),
        "log_loss_ratio": log_loss_ratio["model"],
        "old_log_loss_ratio": log_loss_ratio["old"],
        "below_trivial": below if trivial is not None else 0,
        "steps": statistics.fmean(r["steps"] for r in runs),
        "train_s": statistics.fmean(r["train_s"] for r in runs),
        "hgb_s": statistics.fmean(r["hgb_s"] for r in runs),
        "old_s": statistics.fmean(r["old_s"] for r in runs),
        "settings": runs[0]["settings"],
    }


def print_table(r: dict[str, Any]) -> None:
    """One table per dataset: the model and each baseline, with the chosen settings."""
    seeds = f", mean of {r['seeds']} splits, {r['test_rows']} test rows" if r["seeds"] > 1 else ""
    print(f"\n{r['name']} ({r['rows']} rows, {r['task']}, test {r['metric']}{seeds})")
    print(f"  {'who':<10} {r['metric']:>12} {'vs model':>9} {r['extra']:>10}")
    model = r["scores"]["model"]
    for who, value in r["scores"].items():
        rel = value / model if model else float("nan")
        print(f"  {who:<10} {value:>12.5g} {rel:>9.3f} {r['extras'][who]:>10.4f}")
    chosen = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in r["settings"].items())
    print(f"  trained {r['steps']:.0f} steps in {r['train_s']:.1f} s (hgb fits in "
          f"{r['hgb_s']:.1f} s); settings from the data: "
          f"{chosen}")  # fmt: skip
    flag = f"  BELOW THE TRIVIAL PREDICTOR ({r['below_trivial']}x)" if r["below_trivial"] else ""
    old = "" if math.isnan(r["old_ratio"]) else f" (old default {r['old_ratio']:.3f})"
    print(f"  ratio vs best baseline ({r['best']}): {r['ratio']:.3f}{flag}{old}")
    if r["task"] == "classification":
        old_ll = r["old_log_loss_ratio"]
        print(
            f"  log loss ratio vs best baseline: {r['log_loss_ratio']:.3f}"
            + ("" if math.isnan(old_ll) else f" (old default {old_ll:.3f})")
        )


def worst_ratio(r: dict[str, Any]) -> float:
    """The table's ratio that counts for the goal: accuracy and log loss, or RMSE."""
    if r["task"] == "classification" and not math.isnan(r["log_loss_ratio"]):
        return min(r["ratio"], r["log_loss_ratio"])
    return float(r["ratio"])


def print_summary(results: list[dict[str, Any]]) -> None:
    """The Markdown table of ``benchmarks/README.md``: one row per table."""
    print(
        "\n| table | rows | test rows | model | old default | best baseline | ratio | "
        "log-loss ratio | old ratio | train s | old s | hgb s |"
    )
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        m = r["metric"]
        best, model = r["scores"][r["best"]], r["scores"]["model"]
        old = r["scores"].get("old", math.nan)
        ll = f"{r['log_loss_ratio']:.3f}" if r["task"] == "classification" else ""
        old_ll = f" / {r['old_log_loss_ratio']:.3f}" if r["task"] == "classification" else ""
        print(f"| {r['name']} | {r['rows']:,} | {r['test_rows']:,} | {m} {model:.4g} | "
              f"{old:.4g} | {r['best']} {best:.4g} | {r['ratio']:.3f} | {ll} | "
              f"{r['old_ratio']:.3f}{old_ll} | {r['train_s']:.1f} | {r['old_s']:.1f} | "
              f"{r['hgb_s']:.1f} |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default=",".join(TABLES), help="comma-separated table names")
    parser.add_argument(
        "--max-steps", type=int, default=None, help="cap the optimizer steps (smoke tests)"
    )
    parser.add_argument("--json", default=None, help="also write every figure to this file")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a training setting as the pipeline's hyperparams_json takes it, e.g. "
        "model.linear=none (the plain MLP); repeatable",
    )
    parser.add_argument(
        "--no-old", action="store_true", help="skip the old default's column (half the time)"
    )
    parser.add_argument("--seeds", type=int, default=1, help="fewest split seeds per table")
    parser.add_argument(
        "--min-test-rows",
        type=int,
        default=MIN_TEST_ROWS,
        help="more splits for a small table, until its test rows add up to this many",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (quality does not depend on it; 1 is fastest on a busy machine)",
    )
    args = parser.parse_args(argv)
    names = [n for n in args.tables.split(",") if n]
    unknown = [n for n in names if n not in TABLES]
    if unknown:
        parser.error(f"unknown table(s) {unknown}; known: {', '.join(TABLES)}")
    overrides: dict[str, Any] = {"train.max_steps": args.max_steps} if args.max_steps else {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--set takes key=value, got {item!r}")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value  # a bare string: model.linear=none
    torch.set_num_threads(args.threads)
    results = []
    ctx = dist.init("auto")
    logging.getLogger().setLevel(logging.WARNING)
    try:
        with tempfile.TemporaryDirectory(prefix="default-models-") as tmp:
            for name in names:
                results.append(
                    run_table(
                        name,
                        Path(tmp),
                        ctx,
                        overrides,
                        args.seeds,
                        args.min_test_rows,
                        old=not args.no_old,
                    )
                )
                print_table(results[-1])
    finally:
        dist.close(ctx)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
    print_summary(results)
    worst = min(results, key=worst_ratio)
    below = sum(r["below_trivial"] for r in results)
    mean = statistics.fmean(r["ratio"] for r in results)
    mean_both = statistics.fmean(worst_ratio(r) for r in results)
    old = [r["old_ratio"] for r in results if not math.isnan(r["old_ratio"])]
    failing = sum(worst_ratio(r) < GOAL for r in results)
    print(
        f"\n{len(results)} tables; runs below the trivial predictor: {below}; tables below "
        f"{GOAL}: {failing}; mean ratio {mean:.3f} (goal > 1.0; "
        f"{mean_both:.3f} with the log loss where it is worse)"
        + (f"; old default: mean {statistics.fmean(old):.3f}, worst {min(old):.3f}" if old else "")
    )
    print(
        f"default_models ratio: {worst_ratio(worst):.3f} (goal >= {GOAL}; worst: {worst['name']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
