"""A synthetic customer table (numbers, categories, gaps, a learnable target) for demos."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from trainer.base import outputs
from trainer.base.errors import InputError

STEP = "demo-data"
"""The producer recorded in the demo table's output marker."""
TASKS = ("classification", "regression")
PLANS = ("basic", "pro", "enterprise")
REGIONS = (
    "north", "south", "east", "west", "central", "coast",
    "mountain", "lakes", "islands", "desert", "arctic", "overseas",
)  # fmt: skip
# Skewed: the last few regions are rare, so max_categories and __other__ have work to do.
_REGION_P = np.array([0.2, 0.18, 0.15, 0.12, 0.1, 0.08, 0.06, 0.05, 0.03, 0.015, 0.01, 0.005])
DEVICES = ("android", "ios", "web", "desktop")


def _categorical(
    codes: np.ndarray, values: tuple[str, ...], missing: np.ndarray | None
) -> pa.Array:
    """Text column built from integer codes (fast: no per-row Python strings)."""
    idx = pa.array(codes.astype(np.int32), mask=missing)
    return pa.DictionaryArray.from_arrays(idx, pa.array(values)).cast(pa.string())


def _with_gaps(rng: np.random.Generator, x: np.ndarray, share: float) -> pa.Array:
    """``x`` as an Arrow column with about ``share`` of its values missing (null)."""
    return pa.array(x, mask=rng.random(x.size) < share)


def make_demo_table(rows: int, *, task: str = "classification", seed: int = 0) -> pa.Table:
    """A synthetic customer table whose target is learnable from its columns, with noise.

    Columns: ``age`` (int), ``income`` (lognormal, ~5% missing), ``tenure_months`` (int),
    ``monthly_charges``, ``support_calls`` (int), ``last_login_days`` (~5% missing), ``plan``
    (basic/pro/enterprise), ``region`` (12 values, some rare), ``device`` (~8% missing), and the
    target: ``churned`` ("yes"/"no", about 75-85% accuracy achievable) for classification or
    ``spend`` (float) for regression.

    Args:
        rows: Number of rows.
        task: ``classification`` or ``regression``.
        seed: Seed; the same arguments give the same table.

    Returns:
        The table.

    Raises:
        InputError: If ``rows`` is negative or ``task`` is unknown.
    """
    if rows < 0:
        raise InputError("E_CONFIG", f"rows must be >= 0, got {rows}", "rows")
    if task not in TASKS:
        raise InputError(
            "E_CONFIG", f"task must be one of {', '.join(TASKS)}, got {task!r}", "task"
        )
    rng = np.random.default_rng(seed)
    age = rng.integers(18, 80, rows)
    plan = rng.choice(len(PLANS), rows, p=[0.55, 0.33, 0.12])
    region = rng.choice(len(REGIONS), rows, p=_REGION_P / _REGION_P.sum())
    device = rng.choice(len(DEVICES), rows, p=[0.4, 0.3, 0.2, 0.1])
    device_missing = rng.random(rows) < 0.08
    income = rng.lognormal(mean=10.6 + 0.008 * (age - 18) + 0.25 * plan, sigma=0.5)
    tenure = np.minimum(rng.exponential(24.0, rows), 120).astype(np.int64)
    monthly = np.round(20 + 25 * plan + rng.gamma(2.0, 8.0, rows), 2)
    calls = rng.poisson(0.5 + 0.6 * (plan == 0) + 0.4 * (device == 2), rows)
    last_login = np.round(rng.exponential(10.0, rows), 1)

    columns: dict[str, pa.Array] = {
        "age": pa.array(age),
        "income": _with_gaps(rng, np.round(income, 2), 0.05),
        "tenure_months": pa.array(tenure),
        "monthly_charges": pa.array(monthly),
        "support_calls": pa.array(calls),
        "last_login_days": _with_gaps(rng, last_login, 0.05),
        "plan": _categorical(plan, PLANS, None),
        "region": _categorical(region, REGIONS, None),
        "device": _categorical(device, DEVICES, device_missing),
    }
    # Effects per category: some regions churn more; an unknown device is a warning sign.
    region_effect = np.linspace(-0.4, 0.4, len(REGIONS))[rng.permutation(len(REGIONS))]
    device_effect = np.array([0.1, -0.2, 0.3, 0.0])[device] + 0.5 * device_missing
    if task == "classification":
        logit = (
            -0.6
            + 0.9 * (calls - 1.0)
            - 1.2 * np.log1p(tenure / 12.0)
            + np.array([0.7, 0.0, -0.9])[plan]
            + 0.06 * last_login
            + 0.02 * (monthly - 60)
            - 0.4 * (np.log(income) - 11.0)
            + region_effect[region]
            + device_effect
            + 0.01 * (age - 45) ** 2 / 10
        )
        churned = rng.random(rows) < 1.0 / (1.0 + np.exp(-1.5 * logit))
        columns["churned"] = _categorical(churned.astype(np.int64), ("no", "yes"), None)
    else:
        spend = (
            0.02 * income
            + 8.0 * monthly
            + 30.0 * np.sqrt(tenure)
            + np.array([0.0, 150.0, 600.0])[plan]
            + 200.0 * region_effect[region]
            - 40.0 * calls
            + rng.normal(0.0, 300.0, rows)
        )
        columns["spend"] = pa.array(np.round(spend, 2).astype(np.float32))
    return pa.table(columns)


def write_demo_data(out_uri: str, *, rows: int, task: str, seed: int) -> str:
    """Write the demo table to one file: CSV if ``out_uri`` ends with ``.csv``, else Parquet.

    Args:
        out_uri: File URI to write (any storage URI); written atomically.
        rows: Number of rows.
        task: ``classification`` or ``regression``.
        seed: Seed; the same arguments give the same bytes.

    Returns:
        ``out_uri``.

    Raises:
        InputError: ``rows`` < 1 (``E_CONFIG``), or ``out_uri`` holds a file gpupipe did not
            write (``E_OUTPUT``; the same bytes again are fine).
    """
    if rows < 1:
        raise InputError(
            "E_CONFIG",
            f"rows must be >= 1 (a table with no rows trains nothing), got {rows}",
            "rows",
        )
    table = make_demo_table(rows, task=task, seed=seed)
    sink = pa.BufferOutputStream()
    if out_uri.lower().endswith(".csv"):
        pacsv.write_csv(table, sink)
    else:
        pq.write_table(table, sink, compression="snappy", row_group_size=128 * 1024)
    # A person's table or text file of that name is refused, never replaced (E_OUTPUT).
    outputs.write_output_file(out_uri, sink.getvalue().to_pybytes(), step=STEP)
    return out_uri
