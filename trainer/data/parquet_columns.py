"""Parquet access shared by the tabular datasets: list a dataset's files, choose feature and
target columns, and fill float32 feature rows and a target array, validating as they go.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from trainer.base import storage
from trainer.base.errors import InputError

TASKS = ("classification", "regression")


_BLOCK_ROWS = 16384


@dataclass(frozen=True, slots=True)
class DataFile:
    path: str  # path on the filesystem
    name: str  # how messages name it: the uri, or uri/<file name> for a folder


def parquet_files(uri: str) -> tuple[pafs.FileSystem, list[DataFile]]:
    """Lists a .parquet file, or a folder's .parquet files sorted by name."""
    fs, path = storage.resolve(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise InputError("E_DATA", "dataset not found: no such file or folder", uri)
    if info.type != pafs.FileType.Directory:
        return fs, [DataFile(path, uri)]
    found = fs.get_file_info(pafs.FileSelector(path, recursive=False))
    names = sorted(
        f.base_name
        for f in found
        if f.is_file and f.base_name.endswith(".parquet") and not f.base_name.startswith((".", "_"))
    )
    if not names:
        raise InputError("E_DATA", "dataset folder holds no .parquet files", uri)
    base = uri.rstrip("/")
    return fs, [DataFile(f"{path.rstrip('/')}/{n}", f"{base}/{n}") for n in names]


def read_metadata(fs: pafs.FileSystem, f: DataFile) -> pq.FileMetaData:
    """The Parquet footer of one data file.

    Raises:
        InputError: ``E_DATA`` naming the file when it is not Parquet (or is cut short).
    """
    try:
        return pq.read_metadata(f.path, filesystem=fs)
    except pa.ArrowInvalid as e:
        raise InputError("E_DATA", f"not a readable Parquet file: {e}", f.name) from None


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def resolve_columns(
    schema: pa.Schema, *, target: str, features: Sequence[str] | None, where: str
) -> list[str]:
    """Checks that target and feature columns exist and are numeric; returns the feature names."""
    names = schema.names
    shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
    if target not in names:
        raise InputError("E_DATA", f"target column {target!r} not found (columns: {shown})", where)
    if features is None:
        # pandas writes a non-default index as __index_level_N__: never a feature.
        features = [n for n in names if n != target and not n.startswith("__index_level_")]
    for name in features:
        if name not in names:
            raise InputError(
                "E_DATA", f"feature column {name!r} not found (columns: {shown})", where
            )
        if name == target:
            raise InputError("E_DATA", f"column {name!r} is both the target and a feature", where)
    if not features:
        raise InputError("E_DATA", f"no feature columns besides target {target!r}", where)
    for name in [*features, target]:
        t = schema.field(name).type
        if not _is_numeric(t):
            raise InputError(
                "E_DATA", f"column {name!r} is {t}, not numeric (bool, int or float)", where
            )
    return list(features)


def fill_rows(
    table: pa.Table,
    *,
    features: Sequence[str],
    target: str,
    task: str,
    where: str,
    x: np.ndarray,
    y: np.ndarray,
) -> None:
    """Validates `table` and writes its features into float32 `x` [N, F] and target into `y` [N].

    Raises:
        ValueError: nulls, NaN/inf, or bad class labels; the message names the column and `where`.
    """
    for name in features:
        nulls = table.column(name).null_count
        if nulls:
            raise InputError("E_DATA", f"feature column {name!r} has {nulls} null values", where)
    off = 0
    # Row blocks that stay in cache: about 3x faster than whole-column strided writes into x.
    for rb in table.select(list(features)).to_batches(max_chunksize=_BLOCK_ROWS):
        block = x[off : off + rb.num_rows]
        for j in range(rb.num_columns):
            block[:, j] = rb.column(j).to_numpy(zero_copy_only=False)
        # float64 values beyond float32's range become inf here, so check after the cast.
        if not np.isfinite(block).all():
            name = features[int(np.argmin(np.isfinite(block).all(axis=0)))]
            raise InputError("E_DATA", f"feature column {name!r} contains NaN or inf", where)
        off += rb.num_rows
    y[:] = target_array(table, target, task, where)


def target_array(table: pa.Table, target: str, task: str, where: str) -> np.ndarray:
    """Returns the target as int64 class ids (classification) or float32 (regression)."""
    col = table.column(target)
    if col.null_count:
        raise InputError(
            "E_DATA", f"target column {target!r} has {col.null_count} null values", where
        )
    y = col.to_numpy()
    if y.dtype.kind == "f" and not np.isfinite(y).all():
        raise InputError("E_DATA", f"target column {target!r} contains NaN or inf", where)
    if task == "regression":
        y32 = y.astype(np.float32)
        if not np.isfinite(y32).all():
            raise InputError("E_DATA", f"target column {target!r} overflows float32", where)
        return y32
    if y.dtype.kind == "f":
        bad = y[(y < 0) | (y != np.floor(y))]
    elif y.dtype.kind == "i":
        bad = y[y < 0]
    else:  # bool or unsigned: always valid class ids
        bad = y[:0]
    if bad.size:
        values = ", ".join(str(v) for v in np.unique(bad)[:5].tolist())
        raise ValueError(
            f"{where}: classification target {target!r} must be integer-coded 0..K-1, "
            f"found {values}"
        )
    return y.astype(np.int64)


def empty_rows(n: int, num_features: int, task: str) -> tuple[np.ndarray, np.ndarray]:
    """Uninitialised (x, y) arrays for n rows, with the dtypes batches carry."""
    y_dtype = np.int64 if task == "classification" else np.float32
    return np.empty((n, num_features), dtype=np.float32), np.empty(n, dtype=y_dtype)


def check_task(task: str | None) -> str:
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    return task
