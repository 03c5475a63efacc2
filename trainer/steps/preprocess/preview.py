"""What preprocess will decide about a dataset, found before any step runs.

``gpupipe run --local`` calls :func:`inspect_data` before it starts the pipeline, so the task
(and why), a target that cannot work, date columns (which become numbers) and numbers with the
other decimal separator are said at once, not after minutes of steps. The target column is read
whole (its every value decides the task and the split); the feature columns from the first
:data:`SAMPLE_ROWS` rows of the first file, for what a sample can show for certain.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainer.base import storage
from trainer.base.errors import InputError
from trainer.steps.preprocess.column_checks import DATE_PARTS, date_features
from trainer.steps.preprocess.columns import _comma_numbers_notice, target_column
from trainer.steps.preprocess.config import PreprocessConfig
from trainer.steps.preprocess.splits import check_splits
from trainer.steps.preprocess.tabular import (
    HEAD_BYTES,
    RawInput,
    _check_unique_names,
    _parse_csv,
    _read_file,
    _reader,
    dictionary_codes,
    dtype_name,
    input_files,
    is_text,
    readable_types,
    split_indices,
    text_head,
)
from trainer.steps.preprocess.text_values import Notice, is_temporal, looks_like_dates

SAMPLE_ROWS = 10_000
"""Rows of the first file whose feature columns are inspected."""


def _target_table(files: list[str], cfg: PreprocessConfig) -> tuple[pa.Table, list[bool]]:
    """The target column of every file, concatenated, read as preprocess reads it."""
    csv = cfg.csv_options()
    chunks, is_csv = [], []
    for uri in files:
        blob = storage.read_bytes(uri)
        if blob[:4] == b"PAR1":
            # Arrow-owned memory (_reader): a reader over Python bytes may be let go by a pool
            # thread after interpreter shutdown began, which aborts the process (exit 134).
            schema = pq.read_schema(_reader(blob))
            _check_unique_names(schema.names, uri)
            if cfg.target not in schema.names:
                table = schema.empty_table()  # its names, for the refusal that lists them
            else:
                table = pq.read_table(_reader(blob), columns=[cfg.target])
            table = readable_types(table)
            is_csv.append(False)
        else:
            table = _read_file(uri, blob, csv)[0]
            if cfg.target in table.column_names:
                table = table.select([cfg.target])
            is_csv.append(True)
        chunks.append(table)
    if any(cfg.target not in t.column_names for t in chunks):
        return chunks[0], is_csv  # target_column names the missing target and the columns
    types = {t.schema.types[0] for t in chunks}
    if len(types) > 1:
        chunks = [t.cast(pa.schema([(cfg.target, pa.string())])) for t in chunks]
    return pa.concat_tables(chunks), is_csv


def _sample(uri: str, cfg: PreprocessConfig) -> pa.Table:
    """The first rows of one file (a Parquet file's first batch; a CSV file's first MiB)."""
    with storage.open_input(uri) as f:
        head = f.read(HEAD_BYTES)
        if head[:4] == b"PAR1":
            with pq.ParquetFile(storage.local_path(uri) or f) as pf:
                batches = pf.iter_batches(batch_size=SAMPLE_ROWS)
                try:  # closed here, not left to the garbage collector at exit
                    first = next(batches, None)
                finally:
                    batches.close()
                table = (
                    pf.schema_arrow.empty_table()
                    if first is None
                    else pa.Table.from_batches([first])
                )
            return readable_types(table)
    head = text_head(uri, head)
    return _parse_csv(head, cfg.csv_options(), cfg.csv_options().delimiter_for(uri))


def inspect_data(data_uri: str, cfg: PreprocessConfig) -> list[Notice]:
    """What preprocess will decide about ``data_uri``: notes and warnings, or a refusal.

    Returns:
        The task decision (``I_TASK``) and warnings (``W_TASK``, ``W_TARGET``, ``W_DECIMAL``,
        ``W_TEST_SPLIT``) and date columns (``I_DATE``), in that order.

    Raises:
        InputError: What preprocess would refuse: a target that cannot work (missing values,
            one class, numbers written as text), a split it cannot make.
    """
    files = input_files(data_uri)
    try:
        target, is_csv = _target_table(files, cfg)
    except (OSError, RuntimeError, pa.ArrowException) as e:
        raise InputError("E_DATA", f"cannot read the data: {e}", data_uri) from None
    # One file's bookkeeping for all rows: the messages name the dataset, not a row's file.
    raw = RawInput(data_uri, target, files[:1], np.array([0, target.num_rows]), is_csv, "")
    notes: list[Notice] = []
    if target.num_rows == 0:
        shown = ", ".join(map(repr, _sample(files[0], cfg).column_names[:20]))
        raise InputError(
            "E_EMPTY",
            f"dataset has no rows, only the columns ({shown})",
            data_uri,
        )
    y, _, classes = target_column(raw, cfg, notes)
    n = len(y)
    train, val, test = split_indices(
        n,
        classes=y if classes is not None else None,
        val_fraction=cfg.val_fraction,
        test_fraction=cfg.test_fraction,
        seed=cfg.seed,
    )
    check_splits(raw, cfg, y, classes, train, val, test)
    # Imported here: the evaluate package imports torch, which reading a table does not need.
    from trainer.steps.evaluate import MIN_GATE_ROWS

    if test.size < MIN_GATE_ROWS:
        notes.append(
            Notice(
                "W_TEST_SPLIT",
                f"the test split will have {test.size} rows (test_fraction {cfg.test_fraction} "
                f"of {n}), fewer than the {MIN_GATE_ROWS} a score needs to mean anything: the "
                "model will be trained and scored but not gated or registered",
                data_uri,
            )
        )
    sample = _sample(files[0], cfg)
    sample_raw = RawInput(data_uri, sample, files[:1], np.array([0, sample.num_rows]), is_csv, "")
    for name in sample.column_names:
        role = cfg.column_roles.get(name)
        if name == cfg.target or role in ("drop", "categorical", "numeric"):
            continue
        col = sample.column(name)
        example = f"type {dtype_name(col.type)}" if is_temporal(col.type) else None
        if is_text(col.type):
            _, values = dictionary_codes(col)
            if (value := looks_like_dates(values)) is not None:
                example = repr(value)
            elif role is None:
                _comma_numbers_notice(sample_raw, cfg, name, values, notes)
        if example is not None:
            # The parts preprocess makes: DATE_PARTS, and hour when a value has a time of day
            # (time-zone-aware timestamps included).
            parts = list(DATE_PARTS)
            if "hour" in (date_features(col) or {}):
                parts.append("hour")
            notes.append(
                Notice(
                    "I_DATE",
                    f"column {name!r} holds dates ({example}): it becomes the numbers "
                    f"{', '.join(f'{name}__{p}' for p in parts)}",
                    data_uri,
                )
            )
    return notes
