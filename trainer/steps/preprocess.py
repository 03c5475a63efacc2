"""The preprocess step: raw Parquet/CSV to validated, encoded, standardised data splits."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from trainer import storage
from trainer.config import _require
from trainer.errors import InputError
from trainer.outputs import atomic_dir, check_output_location
from trainer.steps.tabular import (
    CategoricalFit,
    NoTrainingValues,
    NumericFit,
    RawInput,
    dictionary_codes,
    dtype_name,
    encode_categorical,
    encode_numeric,
    is_number,
    is_text,
    read_input,
    split_indices,
)

SCHEMA_FORMAT = "gpupipe.schema/v1"
COLUMN_KINDS = ("numeric", "categorical", "drop")
# An integer (or integral float) target with at most this many distinct values is a class label.
MAX_AUTO_CLASSES = 20
# What a number written as text looks like (RE2 syntax); "inf"/"nan" count, so they are caught
# by the infinite-value check or read as missing instead of being called text.
_NUMBER_RE = r"^\s*[-+]?((\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?|(?i:inf|infinity|nan))\s*$"
# Fixed writer options: the same table always gives the same bytes.
_PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "snappy",
    "row_group_size": 128 * 1024,
    "write_statistics": True,
}


@dataclass(kw_only=True, slots=True)
class PreprocessConfig:
    """What preprocess reads, how it types the columns, and how it splits the rows."""

    target: str
    """The target column."""
    task: Literal["auto", "classification", "regression"] = "auto"
    """``auto``: text or bool targets, and integer-valued targets with at most 20 distinct values,
    are classification; any other numeric target is regression."""
    columns: dict[str, str] | None = None
    """Declared schema: feature column -> ``numeric``, ``categorical`` or ``drop``; columns left
    out are dropped. ``None`` infers: numbers are numeric, text is categorical."""
    val_fraction: float = 0.15
    """Share of rows for the validation split."""
    test_fraction: float = 0.15
    """Share of rows for the test split."""
    seed: int = 0
    """Seed of the split; the same input and seed give byte-identical outputs."""
    max_categories: int = 50
    """Categories kept per categorical column (most frequent in train); rarer -> ``__other__``."""
    missing_indicator: bool = True
    """Add a ``<col>__missing`` 0/1 feature for numeric columns with missing values in train."""
    csv_delimiter: str = ","
    """Field separator of CSV input."""

    def __post_init__(self) -> None:
        _require(bool(self.target), "target", "must name a column", self.target)
        _require(
            self.task in ("auto", "classification", "regression"),
            "task",
            "must be one of auto, classification, regression",
            self.task,
        )
        if self.columns is not None:
            for name, kind in self.columns.items():
                _require(
                    kind in COLUMN_KINDS, f"columns.{name}", f"must be one of {COLUMN_KINDS}", kind
                )
            _require(
                self.target not in self.columns,
                f"columns.{self.target}",
                "must not declare the target (it is typed by task)",
                self.columns.get(self.target),
            )
            _require(
                any(k != "drop" for k in self.columns.values()),
                "columns",
                "must declare at least one numeric or categorical feature",
                self.columns,
            )
        _require(0 <= self.val_fraction < 1, "val_fraction", "must be in [0, 1)", self.val_fraction)
        _require(
            0 <= self.test_fraction < 1, "test_fraction", "must be in [0, 1)", self.test_fraction
        )
        _require(
            self.val_fraction + self.test_fraction < 1,
            "test_fraction",
            f"plus val_fraction={self.val_fraction} must be < 1 (rows must remain for training)",
            self.test_fraction,
        )
        _require(self.seed >= 0, "seed", "must be >= 0", self.seed)
        _require(self.max_categories > 0, "max_categories", "must be > 0", self.max_categories)
        _require(
            len(self.csv_delimiter) == 1,
            "csv_delimiter",
            "must be one character",
            self.csv_delimiter,
        )


@dataclass(slots=True)
class PreprocessResult:
    """What preprocess produced; also recorded in ``schema.json``."""

    train_rows: int
    val_rows: int
    test_rows: int
    features: list[str]
    task: str
    classes: list[str] | None
    data_hash: str

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (for KFP outputs and logs)."""
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------
# Column typing and validation
# --------------------------------------------------------------------------------------------


def _text_as_numbers(
    data: RawInput, name: str, codes: np.ndarray, values: list[str], *, declared: bool
) -> np.ndarray | None:
    """float64 values of a text column that holds numbers, or None if it holds words.

    Raises:
        InputError: The column is declared numeric (``declared``) but holds words, or it looks
            numeric (most values are numbers) but some are not; names a bad value and its row.
    """
    is_num = pc.match_substring_regex(pa.array(values, pa.string()), _NUMBER_RE)
    numeric = np.append(is_num.to_numpy(zero_copy_only=False).astype(bool), True)  # -1: missing
    counts = np.bincount(codes + 1, minlength=len(values) + 1)[1:]
    n_numbers = int(counts[numeric[:-1]].sum())
    n_words = int(counts.sum()) - n_numbers
    if n_words == 0:
        as_float = pc.cast(pc.utf8_trim_whitespace(pa.array(values, pa.string())), pa.float64())
        return np.append(as_float.to_numpy(zero_copy_only=False), np.nan)[codes]
    if not declared and n_numbers <= n_words:
        return None  # a text column with the odd number in it: categorical
    row = int(np.flatnonzero(~numeric[codes])[0])
    bad = values[codes[row]]
    if declared:
        raise InputError(
            "E_SCHEMA",
            f"column {name!r} is declared numeric but holds text: {bad!r} is not a number",
            data.locate(row),
        )
    raise InputError(
        "E_MIXED_TYPES",
        f"column {name!r} mixes numbers and text ({n_numbers} numbers, {n_words} other): "
        f"{bad!r} is not a number; fix the value or declare the column categorical",
        data.locate(row),
    )


def _numbers(data: RawInput, name: str, col: pa.ChunkedArray) -> np.ndarray:
    """float64 copy of a numeric column, NaN for missing (null or NaN).

    Raises:
        InputError: If a value is infinite (names the row).
    """
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if not pa.types.is_float64(arr.type):
        arr = arr.cast(pa.float64())
    x = arr.to_numpy(zero_copy_only=False)  # may be read-only: encoders get a gathered copy
    _check_finite(data, name, x)
    return x


def _check_finite(data: RawInput, name: str, x: np.ndarray) -> None:
    inf = np.isinf(x)
    if inf.any():
        row = int(np.argmax(inf))
        raise InputError(
            "E_INFINITE",
            f"column {name!r} holds an infinite value ({x[row]}); "
            "replace it with a finite number or leave it empty",
            data.locate(row),
        )


@dataclass(slots=True)
class _Column:
    """A feature column ready to encode: float64 values or (codes, values) over all rows."""

    name: str
    kind: str
    dtype: str
    numbers: np.ndarray | None = None
    codes: np.ndarray | None = None
    values: list[str] | None = None


def _feature_columns(data: RawInput, cfg: PreprocessConfig) -> tuple[list[_Column], list[str]]:
    """Type and validate every feature column; returns (columns, dropped column names)."""
    table = data.table
    names = [n for n in table.column_names if n != cfg.target]
    if cfg.columns is not None:
        absent = [n for n in cfg.columns if n not in table.column_names]
        if absent:
            raise InputError(
                "E_SCHEMA",
                f"declared column {absent[0]!r} is not in the data "
                f"(columns: {_shown(table.column_names)})",
                data.uri,
            )
        wanted = {n for n, k in cfg.columns.items() if k != "drop"}
        names, dropped = [n for n in names if n in wanted], [n for n in names if n not in wanted]
    else:
        dropped = []
    out = []
    for name in names:
        col = table.column(name)
        declared = cfg.columns.get(name) if cfg.columns is not None else None
        if col.null_count == len(col):
            raise InputError(
                "E_ALL_MISSING",
                f"column {name!r} has no values (all {len(col)} missing); drop it or fill it",
                data.uri,
            )
        dtype = dtype_name(col.type)
        if is_number(col.type):
            if declared == "categorical":
                col = col.cast(pa.string())
                codes, values = dictionary_codes(col)
                out.append(_Column(name, "categorical", dtype, codes=codes, values=values))
                continue
            x = _numbers(data, name, col)
        elif is_text(col.type):
            codes, values = dictionary_codes(col)
            if declared == "categorical":
                out.append(_Column(name, "categorical", dtype, codes=codes, values=values))
                continue
            maybe = _text_as_numbers(data, name, codes, values, declared=declared == "numeric")
            if maybe is None:
                out.append(_Column(name, "categorical", dtype, codes=codes, values=values))
                continue
            x = maybe
            _check_finite(data, name, x)
        else:
            raise InputError(
                "E_SCHEMA",
                f"column {name!r} has unsupported type {dtype}; declare it 'drop' in columns",
                data.uri,
            )
        if np.isnan(x).all():
            raise InputError(
                "E_ALL_MISSING",
                f"column {name!r} has no values (all {len(x)} missing or NaN); drop it or fill it",
                data.uri,
            )
        out.append(_Column(name, "numeric", dtype, numbers=x))
    if not out:
        raise InputError("E_SCHEMA", f"no feature columns besides target {cfg.target!r}", data.uri)
    return out, dropped


def _shown(names: list[str]) -> str:
    return ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")


def _label(v: Any) -> str:
    """A class label as text: integral numbers without a trailing ``.0``."""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _target(data: RawInput, cfg: PreprocessConfig) -> tuple[np.ndarray, str, list[str] | None]:
    """The target as (int64 class ids or float32 values, task, class labels or None)."""
    table, name = data.table, cfg.target
    if name not in table.column_names:
        raise InputError(
            "E_COLUMN",
            f"target column {name!r} not found (columns: {_shown(table.column_names)})",
            data.uri,
        )
    col = table.column(name)
    if pa.types.is_boolean(col.type):
        col = col.cast(pa.string())  # "false"/"true": labels, not numbers
    if col.null_count:
        row = int(np.argmax(col.is_null().to_numpy(zero_copy_only=False)))
        raise InputError(
            "E_TARGET",
            f"target column {name!r} has {col.null_count} missing values; every row needs one",
            data.locate(row),
        )
    if is_text(col.type):
        if cfg.task == "regression":
            raise InputError(
                "E_TARGET", f"regression target {name!r} must be numeric, got {col.type}", data.uri
            )
        codes, values = dictionary_codes(col)
        order = np.argsort(np.array(values, dtype=object), kind="stable")
        classes = [values[i] for i in order]
        rank = np.empty(len(values), dtype=np.int64)
        rank[order] = np.arange(len(values))
        y, task = rank[codes], "classification"
    elif is_number(col.type):
        x = _numbers(data, name, col)
        if np.isnan(x).any():
            row = int(np.argmax(np.isnan(x)))
            raise InputError(
                "E_TARGET",
                f"target column {name!r} has NaN values; every row needs one",
                data.locate(row),
            )
        task = cfg.task
        if task == "auto":
            integral = bool(np.all(x == np.floor(x)))
            few = integral and len(np.unique(x)) <= MAX_AUTO_CLASSES
            task = "classification" if few else "regression"
        if task == "regression":
            return x.astype(np.float32), task, None
        uniq, y = np.unique(x, return_inverse=True)
        classes = [_label(v) for v in uniq.tolist()]
    else:
        raise InputError(
            "E_TARGET", f"target column {name!r} has unsupported type {col.type}", data.uri
        )
    if len(classes) < 2:
        raise InputError(
            "E_TARGET",
            f"target column {name!r} has one class ({classes[0]!r}); "
            "classification needs at least two",
            data.uri,
        )
    return y.astype(np.int64), task, classes


# --------------------------------------------------------------------------------------------
# The step
# --------------------------------------------------------------------------------------------


def _numeric_stats(x: np.ndarray) -> dict[str, Any]:
    present = x[~np.isnan(x)]
    return {
        "count": int(present.size),
        "missing": int(x.size - present.size),
        "min": float(present.min()),
        "max": float(present.max()),
        "mean": float(present.mean()),
        "std": float(present.std()),
    }


def _categorical_stats(codes: np.ndarray, values: list[str], top: int = 10) -> dict[str, Any]:
    counts = np.bincount(codes[codes >= 0], minlength=len(values))
    order = np.lexsort((np.array(values, dtype=object).astype(str), -counts))[:top]
    return {
        "count": int(counts.sum()),
        "missing": int(np.count_nonzero(codes < 0)),
        "distinct": len(values),
        "top": [{"value": values[i], "count": int(counts[i])} for i in order if counts[i] > 0],
    }


def _target_stats(y: np.ndarray, classes: list[str] | None) -> dict[str, Any]:
    if classes is not None:
        counts = np.bincount(y, minlength=len(classes))
        return {"rows": int(y.size), "classes": dict(zip(classes, counts.tolist(), strict=True))}
    if y.size == 0:
        return {"rows": 0}
    y64 = y.astype(np.float64)
    return {
        "rows": int(y.size),
        "mean": float(y64.mean()),
        "std": float(y64.std()),
        "min": float(y64.min()),
        "max": float(y64.max()),
    }


def _write_parquet(uri: str, table: pa.Table, dictionary_columns: list[str]) -> None:
    # Dictionary pages only where they pay: 0/1 and class-id columns shrink to almost nothing,
    # while trying them on standardised floats (mostly distinct) about doubles the write time.
    with storage.open_output(uri) as f:
        pq.write_table(table, f, use_dictionary=dictionary_columns, **_PARQUET_OPTIONS)


def preprocess(cfg: PreprocessConfig, *, data_uri: str, output_uri: str) -> PreprocessResult:
    """Validate, split, impute, encode and standardise a tabular dataset.

    Reads a Parquet or CSV file (or a folder of them), types every column (declared or
    inferred), splits the rows (seeded; stratified for classification), fits imputation,
    category lists and standardisation on the training split only, and publishes
    ``train.parquet``, ``val.parquet``, ``test.parquet``, ``schema.json`` and ``stats.json``
    under ``output_uri`` atomically. The same input and seed give byte-identical outputs.

    Args:
        cfg: What to read and how.
        data_uri: A data file or a folder of data files (any storage URI).
        output_uri: Folder to publish the outputs to: absent, empty, or an earlier preprocess
            output (which is replaced); anything else is refused (``E_OUTPUT``).

    Returns:
        Split sizes, output feature names, task, class labels and the input's hash.

    Raises:
        InputError: Bad input (missing file, empty data, missing target, one class, an
            all-missing column, infinite values, mixed types, a schema that disagrees with the
            data); the message names the file or column and the bad value. Nothing is written.
    """
    # Before any work: never write into the data, the working directory or anyone's files.
    check_output_location(output_uri, "preprocess", inputs={"data": data_uri})
    data = read_input(data_uri, cfg.csv_delimiter)
    n = data.table.num_rows
    if n == 0:
        raise InputError("E_EMPTY", "dataset is empty: 0 rows", data_uri)
    y, task, classes = _target(data, cfg)
    columns, dropped = _feature_columns(data, cfg)
    train_idx, val_idx, test_idx = split_indices(
        n,
        classes=y if classes is not None else None,
        val_fraction=cfg.val_fraction,
        test_fraction=cfg.test_fraction,
        seed=cfg.seed,
    )
    if train_idx.size == 0:
        raise InputError("E_EMPTY", f"too few rows ({n}) to leave any for training", data_uri)
    # Rows in split order: each split is then a contiguous slice of every output column.
    perm = np.concatenate([train_idx, val_idx, test_idx])
    n_train = train_idx.size
    bounds = {"train": (0, n_train), "val": (n_train, n_train + val_idx.size)}
    bounds["test"] = (bounds["val"][1], n)

    fits: list[NumericFit | CategoricalFit] = []
    outputs: list[np.ndarray] = []
    stats: dict[str, Any] = {}
    for col in columns:
        try:
            if col.numbers is not None:
                stats[col.name] = {"kind": "numeric", **_numeric_stats(col.numbers)}
                fit: NumericFit | CategoricalFit
                fit, arrays = encode_numeric(
                    col.name,
                    col.dtype,
                    col.numbers[perm],
                    n_train,
                    missing_indicator=cfg.missing_indicator,
                )
            else:
                assert col.codes is not None and col.values is not None
                stats[col.name] = {
                    "kind": "categorical",
                    **_categorical_stats(col.codes, col.values),
                }
                fit, arrays = encode_categorical(
                    col.name,
                    col.dtype,
                    col.codes[perm],
                    col.values,
                    n_train,
                    max_categories=cfg.max_categories,
                )
        except NoTrainingValues:
            raise InputError(
                "E_ALL_MISSING",
                f"column {col.name!r} has no values in the training split "
                f"({n_train} rows, seed {cfg.seed}); drop it or fill it",
                data_uri,
            ) from None
        col.numbers = col.codes = None  # encoded: free the raw values early
        fits.append(fit)
        outputs.extend(arrays)
    features = [name for fit in fits for name in fit.outputs]
    clash = sorted({f for f in features if features.count(f) > 1} | ({cfg.target} & set(features)))
    if clash:
        raise InputError(
            "E_SCHEMA",
            f"output feature name {clash[0]!r} is produced twice; rename a column",
            data_uri,
        )
    y_perm = y[perm]
    target_type = pa.int64() if classes is not None else pa.float32()
    schema = pa.schema(
        [pa.field(f, pa.float32(), nullable=False) for f in features]
        + [pa.field(cfg.target, target_type, nullable=False)]
    )
    splits = {name: hi - lo for name, (lo, hi) in bounds.items()}
    schema_doc = {
        "format": SCHEMA_FORMAT,
        "target": cfg.target,
        "task": task,
        "features": features,
        "columns": [fit.to_dict() for fit in fits],
        "dropped": dropped,
        "classes": classes,
        "data_hash": data.data_hash,
        "seed": cfg.seed,
        "splits": splits,
    }
    stats_doc = {
        "rows": n,
        "columns": stats,
        "target": {
            name: _target_stats(y_perm[lo:hi], classes) for name, (lo, hi) in bounds.items()
        },
    }
    numeric_outputs = {fit.name for fit in fits if isinstance(fit, NumericFit)}
    dictionary_columns = [f for f in features if f not in numeric_outputs]
    if classes is not None:
        dictionary_columns.append(cfg.target)
    with atomic_dir(output_uri, step="preprocess") as tmp, ThreadPoolExecutor(len(bounds)) as pool:
        writes = []
        for name, (lo, hi) in bounds.items():
            # Slices of contiguous columns: pyarrow wraps them without copying.
            arrays = [pa.array(a[lo:hi]) for a in outputs] + [pa.array(y_perm[lo:hi])]
            table = pa.table(arrays, schema=schema)
            uri = storage.join(tmp, f"{name}.parquet")
            # The Parquet writer releases the GIL: the three splits encode in parallel.
            writes.append(pool.submit(_write_parquet, uri, table, dictionary_columns))
        for write in writes:
            write.result()
        storage.write_json(storage.join(tmp, "schema.json"), schema_doc)
        storage.write_json(storage.join(tmp, "stats.json"), stats_doc)
    return PreprocessResult(
        train_rows=splits["train"],
        val_rows=splits["val"],
        test_rows=splits["test"],
        features=features,
        task=task,
        classes=classes,
        data_hash=data.data_hash,
    )
