"""The preprocess step: raw Parquet/CSV to validated, encoded, standardised data splits.

Its config is :mod:`trainer.steps.preprocess.config`; the column checks are
:mod:`trainer.steps.preprocess.columns`; reading, encoding and splitting are
:mod:`trainer.steps.preprocess.tabular`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainer.base import storage
from trainer.base.errors import InputError
from trainer.base.outputs import atomic_dir, check_output_location
from trainer.steps.preprocess.columns import label_variants, target_column
from trainer.steps.preprocess.config import PreprocessConfig
from trainer.steps.preprocess.feature_columns import feature_columns, leakage_warnings
from trainer.steps.preprocess.fingerprint import data_fingerprint
from trainer.steps.preprocess.limits import (
    InputTooLarge,
    check_columns,
    check_features,
    check_input_bytes,
    parquet_bytes,
)
from trainer.steps.preprocess.published import (
    _PARQUET_OPTIONS,
    SCHEMA_FORMAT,
    PreprocessResult,
    display_uri,
    published_result,
    schema_document,
)
from trainer.steps.preprocess.published import feature_names as _feature_names
from trainer.steps.preprocess.splits import check_scaled, check_splits
from trainer.steps.preprocess.tabular import (
    COMPRESSED_SUFFIXES,
    CategoricalFit,
    NoTrainingValues,
    NumericFit,
    encode_categorical,
    encode_numeric,
    input_files,
    is_hive,
    param,
    read_columns,
    read_input,
    role_param,
    split_indices,
)
from trainer.steps.preprocess.text_values import Notice
from trainer.steps.preprocess.wide import PodsJob

__all__ = ["SCHEMA_FORMAT", "PreprocessResult", "display_uri", "needs_streaming", "preprocess"]


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


def _check_fingerprint(data_uri: str, expected: str, *, artifact: bool) -> str:
    """The data's fingerprint now; E_DATA_CHANGED if it is not the one the run was keyed on.

    A pipeline computes the fingerprint before this step and KFP's cache keys the step on it:
    data replaced in between would be published under the old key, so it is refused.
    """
    now = data_fingerprint(data_uri, artifact=artifact)
    if expected and now != expected:
        raise InputError(
            "E_DATA_CHANGED",
            f"the data changed while the run was starting (fingerprint {expected[:16]}... "
            f"when the run began, {now[:16]}... now); run the pipeline again",
            data_uri,
        )
    return now


IN_MEMORY_FACTOR = 8
"""Peak memory of the in-memory path per byte of the table's uncompressed size (measured:
about 0.33 KB a row of a 10-column table whose Parquet data is ~40 bytes a row)."""
COMPRESSED_TEXT_FACTOR = 5
"""Assumed compression ratio of a ``.gz``/``.bz2``/``.zst`` text file."""


def in_memory_bytes(data_uri: str) -> int:
    """The memory the in-memory path would take for ``data_uri``, estimated from metadata only:
    Parquet footers' uncompressed sizes, text files' sizes (compressed ones times
    :data:`COMPRESSED_TEXT_FACTOR`)."""
    total = 0
    for uri in input_files(data_uri):
        with storage.open_input(uri) as f:
            magic = f.read(4)
        if magic == b"PAR1":
            try:
                with storage.open_input(uri) as f:
                    meta = pq.ParquetFile(f).metadata
                    total += sum(
                        meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)
                    )
            except (pa.ArrowException, OSError):
                total += storage_size(uri)  # unreadable: the reader names the problem
        else:
            size = storage_size(uri)
            compressed = uri.lower().endswith(COMPRESSED_SUFFIXES) or magic[:2] == b"\x1f\x8b"
            total += size * (COMPRESSED_TEXT_FACTOR if compressed else 1)
    return total * IN_MEMORY_FACTOR


def storage_size(uri: str) -> int:
    """Size in bytes of file ``uri``."""
    fs, path = storage.resolve(uri)
    return int(fs.get_file_info(path).size or 0)


def needs_streaming(data_uri: str, budget: int) -> bool:
    """Whether preprocess reads ``data_uri`` in record batches: a Hive-partitioned folder, or a
    table whose in-memory size (:func:`in_memory_bytes`) exceeds ``budget``."""
    if is_hive(data_uri, input_files(data_uri)):
        return True
    return in_memory_bytes(data_uri) > budget


def preprocess(
    cfg: PreprocessConfig,
    *,
    data_uri: str,
    output_uri: str,
    expected_fingerprint: str = "",
    artifact: bool = False,
    pods: PodsJob | None = None,
) -> PreprocessResult:
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
        expected_fingerprint: The data's fingerprint when the run began (the pipeline's
            fingerprint step); the data must still have it (``E_DATA_CHANGED``). Empty: not
            checked. The fingerprint is recorded in ``schema.json`` either way.
        artifact: ``data_uri`` is the local copy of a Dataset artifact (KFP's launcher
            downloaded it): its fingerprint leaves the files' modification times out.
        pods: Where a ``launcher: pytorchjob`` job's pods find the data and publish the output
            (store URIs; the output then goes to ``pods.output_uri``, not ``output_uri``).
            Needed when ``cfg.launcher`` is ``pytorchjob`` and more than one pod is chosen.

    Returns:
        Split sizes, output feature names, task, class labels and the input's hash.

    Raises:
        InputError: Bad input (a missing, empty or malformed file, duplicate column names, a
            missing target, one class, an all-missing column, infinite values or values that
            overflow float32, mixed types, a declared role that disagrees with the data, a
            split too small to train, validate or test on); the message names the user's file
            or column and the bad value, and says which pipeline parameter fixes it where one
            does. Nothing is written.
    """
    # Before any work: never write into the data, the working directory or anyone's files.
    check_output_location(output_uri, "preprocess", inputs={"data": data_uri})
    fingerprint = _check_fingerprint(data_uri, expected_fingerprint, artifact=artifact)
    budget = cfg.budget()
    # The input's shape from its footers and header, before any work (limits.py).
    try:
        names = read_columns(data_uri, cfg.csv_options())
    except InputError:
        names = []  # an unreadable file: the reader below names what is wrong with it
    check_columns(len(names), cfg.max_columns, data_uri)
    check_input_bytes(parquet_bytes(input_files(data_uri)), cfg.max_input_bytes, data_uri)
    try:
        if cfg.workers > 1 or needs_streaming(data_uri, budget):
            raise InputTooLarge(data_uri)
        # A compressed file is read only as far as the budget, and no further than
        # max_input_bytes of text: one that expands further than its name promised goes the
        # streaming way (which counts it against max_input_bytes as it is parsed).
        most = min(budget // IN_MEMORY_FACTOR, cfg.max_input_bytes)
        data = read_input(data_uri, cfg.csv_options(), max_text_bytes=most)
        if data.any_csv:  # Parquet's size was read from its footers above
            check_input_bytes(data.table.nbytes, cfg.max_input_bytes, data_uri)
    except InputTooLarge:
        from trainer.steps.preprocess.stream import preprocess_streaming
        from trainer.steps.preprocess.wide import pods_for, run_local, run_pods, workers_for

        if cfg.launcher == "pytorchjob" and (n_pods := pods_for(cfg, data_uri)) > 1:
            if pods is None:
                raise InputError(
                    "E_CONFIG",
                    f"launcher pytorchjob chose {n_pods} pods, but the step was given no store "
                    "location for their input and output (the KFP component and "
                    "`python -m trainer preprocess --job-name` give one)",
                    "launcher",
                ) from None
            return run_pods(cfg, pods, pods=n_pods, fingerprint=fingerprint)
        workers = workers_for(cfg, data_uri, budget)
        if workers > 1:
            return run_local(
                cfg, workers=workers, data_uri=data_uri, output_uri=output_uri,
                fingerprint=fingerprint, budget=budget,
            )  # fmt: skip

        return preprocess_streaming(
            cfg, data_uri=data_uri, output_uri=output_uri, fingerprint=fingerprint, budget=budget
        )
    n = data.table.num_rows
    if n == 0:
        shown = ", ".join(map(repr, data.table.column_names[:20]))
        raise InputError("E_EMPTY", f"dataset has no rows, only the columns ({shown})", data_uri)
    notes: list[Notice] = []
    y, task, classes = target_column(data, cfg, notes)
    label_variants(cfg.target, classes, y, notes)
    columns, dropped, decisions = feature_columns(data, cfg, notes)
    decisions += leakage_warnings(data, columns, y, classes, cfg.target, notes)
    train_idx, val_idx, test_idx = split_indices(
        n,
        classes=y if classes is not None else None,
        val_fraction=cfg.val_fraction,
        test_fraction=cfg.test_fraction,
        seed=cfg.seed,
    )
    check_splits(data, cfg, y, classes, train_idx, val_idx, test_idx)
    # Rows in split order: each split is then a contiguous slice of every output column.
    perm = np.concatenate([train_idx, val_idx, test_idx])
    n_train = train_idx.size
    bounds = {"train": (0, n_train), "val": (n_train, n_train + val_idx.size)}
    bounds["test"] = (bounds["val"][1], n)

    fits, outputs, stats = _encode_columns(columns, perm, n_train, cfg, data, data_uri)
    features = _feature_names(fits, cfg.target, data_uri)
    check_features(len(features), cfg.max_features, data_uri)
    y_perm = y[perm]
    target_type = pa.int64() if classes is not None else pa.float32()
    schema = pa.schema(
        [pa.field(f, pa.float32(), nullable=False) for f in features]
        + [pa.field(cfg.target, target_type, nullable=False)]
    )
    splits = {name: hi - lo for name, (lo, hi) in bounds.items()}
    schema_doc = schema_document(
        target=cfg.target, task=task, fits=fits, dropped=dropped, decisions=decisions,
        notes=notes, classes=classes, data_hash=data.data_hash, fingerprint=fingerprint,
        data_uri=data_uri, seed=cfg.seed, splits=splits, features=features,
    )  # fmt: skip
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
    # Slices of contiguous columns: pyarrow wraps them without copying.
    tables = {
        name: pa.table(
            [pa.array(a[lo:hi]) for a in outputs] + [pa.array(y_perm[lo:hi])], schema=schema
        )
        for name, (lo, hi) in bounds.items()
    }
    docs = {"schema.json": schema_doc, "stats.json": stats_doc}
    _publish(output_uri, tables, dictionary_columns, docs)
    return published_result(splits, features, task, classes, data.data_hash, notes)


def _encode_columns(
    columns: list[Any],
    perm: np.ndarray,
    n_train: int,
    cfg: PreprocessConfig,
    data: Any,
    data_uri: str,
) -> tuple[list[NumericFit | CategoricalFit], list[np.ndarray], dict[str, Any]]:
    """Fit and apply each column's encoding on the training split; rows in ``perm`` order."""
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
                check_scaled(data, fit, arrays[0], col.numbers, perm)
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
                f"({n_train} rows, seed {cfg.seed}); fill it, drop it with "
                f"{role_param(col.name, 'drop')}, or split differently with "
                f"{param('seed', cfg.seed + 1)}",
                data_uri,
            ) from None
        col.numbers = col.codes = None  # encoded: free the raw values early
        fits.append(fit)
        outputs.extend(arrays)
    return fits, outputs, stats


def _publish(
    output_uri: str,
    tables: dict[str, pa.Table],
    dictionary_columns: list[str],
    docs: dict[str, dict[str, Any]],
) -> None:
    """Write ``<split>.parquet`` for each table (in parallel) and the JSON docs, atomically."""
    with atomic_dir(output_uri, step="preprocess") as tmp, ThreadPoolExecutor(len(tables)) as pool:
        # The Parquet writer releases the GIL: the splits encode in parallel.
        writes = [
            pool.submit(
                _write_parquet, storage.join(tmp, f"{name}.parquet"), table, dictionary_columns
            )
            for name, table in tables.items()
        ]
        for write in writes:
            write.result()
        for name, doc in docs.items():
            storage.write_json(storage.join(tmp, name), doc)
